"""Queues: their controls (pause, limits) and their figures."""
