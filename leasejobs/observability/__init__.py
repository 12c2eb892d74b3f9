"""What leasejobs reports: events fanned out to signals, metrics, traces and logs."""
