"""A small "linger, then flush a batch" buffer, run by one thread.

Items arrive one by one from many threads; the flushing thread waits a few
milliseconds for company, then hands up to ``max_batch`` of them to
``flush`` in one call. ``flush`` returns the items it could not handle yet
(they are tried again after ``retry_seconds``). A steady stream of items
thus costs a fraction of a round trip each, and a lone item waits only the
linger.
"""

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LingerBatcher(Generic[T]):
    def __init__(
        self,
        flush: Callable[[list[T]], list[T]],
        *,
        linger_seconds: float,
        max_batch: int,
        retry_seconds: float = 0.2,
    ) -> None:
        self._flush = flush
        self.linger_seconds = linger_seconds
        self.max_batch = max_batch
        self.retry_seconds = retry_seconds
        self._items: deque[T] = deque()
        self._ready = threading.Event()
        self._closing = False

    def add(self, item: T) -> None:
        """Queue one item; the flushing thread picks it up within the linger."""
        self._items.append(item)
        if not self._ready.is_set():
            self._ready.set()

    def pending(self) -> int:
        return len(self._items)

    def close(self) -> None:
        """Flush what is queued without lingering, then return from ``run``."""
        self._closing = True
        self._ready.set()

    def run(self, give_up: Callable[[], bool]) -> list[T]:
        """Flush batches until closed and empty; returns what is left when ``give_up()`` says so."""
        pending: list[T] = []
        while True:
            if not pending and not self._items:
                if self._closing:
                    return []
                self._ready.wait()
                self._ready.clear()
                if len(self._items) < self.max_batch and not self._closing:
                    time.sleep(self.linger_seconds)  # wait for company
            while self._items and len(pending) < self.max_batch:
                pending.append(self._items.popleft())
            if not pending:
                continue
            pending = self._flush(pending)
            if pending:
                if self._closing and give_up():
                    return pending + list(self._items)
                time.sleep(self.retry_seconds)
