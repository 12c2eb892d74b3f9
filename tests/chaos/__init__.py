"""Chaos scenarios: real workers killed, paused, cut off and starved while jobs run."""
