"""What a task is: the registry, binding arguments, enqueueing, retries and the
running job's context."""
