"""Messages between the worker and one child: pickled, length-prefixed, on a socket pair.

The worker's side never blocks (``Channel``): one thread serves every child,
and a child that is paused or hung must not stop it. What it cannot write
now waits in the channel's buffer until the socket takes it; what arrives is
read in whatever pieces the socket gives and cut into whole messages. The
child's side simply blocks (``ChildChannel``): a child has nothing else to
do while it waits for work, and a worker that stops reading is a worker
whose zygote stops the child at its lease's end.

A message is any picklable object; both ends are the same program, so
pickle's trust in its input is the trust a process has in its own fork.
"""

import os
import pickle
import select
import socket
import struct
from collections import deque
from typing import Any

_HEADER = struct.Struct("!I")
#: Read this much per system call.
_CHUNK = 1 << 18


def _frame(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


class _Frames:
    """Bytes in, whole messages out."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self._buffer += data
        messages = []
        view = self._buffer
        start = 0
        while len(view) - start >= _HEADER.size:
            (size,) = _HEADER.unpack_from(view, start)
            end = start + _HEADER.size + size
            if len(view) < end:
                break
            messages.append(pickle.loads(view[start + _HEADER.size : end]))
            start = end
        if start:
            del self._buffer[:start]
        return messages


class Channel:
    """The worker's end of one child's socket: never blocks.

    Not thread-safe: its owner (the pool) sends and flushes under its lock.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._out: deque[memoryview] = deque()
        self._frames = _Frames()
        self.closed = False
        #: The child's end is closed: nothing more will arrive.
        self.eof = False

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def pending(self) -> bool:
        """Bytes wait to be written (the socket was full)."""
        return bool(self._out)

    def send(self, message: Any) -> None:
        """Queue a message and write what the socket takes now."""
        if self.closed:
            return
        self._out.append(memoryview(_frame(message)))
        self.flush()

    def flush(self) -> None:
        """Write queued bytes until the socket is full; a dead peer closes the channel."""
        while self._out and not self.closed:
            head = self._out[0]
            try:
                sent = self.sock.send(head)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the child is gone: its end is closed
                self._out.clear()
                return
            if sent == len(head):
                self._out.popleft()
            else:
                self._out[0] = head[sent:]

    def receive(self) -> list[Any] | None:
        """The whole messages that arrived; None once the child's end is closed (it exited).

        It never closes this end itself: its owner does, under its lock.
        """
        messages: list[Any] = []
        while True:
            try:
                data = self.sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                return messages
            except OSError:
                data = b""
            if not data:
                self.eof = True
                return messages or None
            messages += self._frames.feed(data)
            if len(data) < _CHUNK:
                return messages

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._out.clear()
            self.sock.close()


class ChildChannel:
    """The child's end: blocking sends, blocking or polled receives."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(True)
        self._frames = _Frames()

    def send(self, message: Any) -> None:
        self.sock.sendall(_frame(message))

    def receive(self, *, wait: bool) -> list[Any] | None:
        """Messages that arrived (waiting for one if ``wait``); None once the worker is gone."""
        while True:
            if not wait and not select.select([self.sock], [], [], 0)[0]:
                return []
            try:
                data = self.sock.recv(_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                return None
            if not data:
                return None
            messages = self._frames.feed(data)
            if messages:
                return messages


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """The worker's end and the child's end (inheritable: the zygote hands it to the fork)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    os.set_inheritable(theirs.fileno(), True)
    return ours, theirs
