"""Operations on the queue: pruning, fenced bulk changes, autovacuum checks."""
