"""The zygote: the worker's fork server, and the watchdog of its children's leases.

The worker forks the zygote once, at start, while it is still one thread
(forking a process whose other threads may hold locks can leave the child
waiting forever on one of them). The zygote stays single-threaded: it forks
every child the worker asks for (all of Django and the tasks already
imported, so a child is ready in milliseconds), reaps them and tells the
worker how each one ended (its exit status names the signal that killed
it), and every ``WATCH_SECONDS`` kills a child whose running body has
outlived its lease (``SlotTable.outlived``): the worker may be paused
(SIGSTOP, a stopped VM) and unable to stop that body itself, and once a
lease has run out another worker may hold the job. The zygote leads a
process group of its own, as each child does: a stop of the worker's group
(Ctrl-Z in a terminal) stops neither the watchdog nor the bodies.

The zygote leaves when the worker's end of its control socket closes,
which the kernel does when the worker dies however it dies, or when it
finds it is no longer the worker's child (the worker died; the zygote does
not count on one signal of its death). It kills the process group of every
child first (a child's own group: what its bodies forked and left behind
goes with it, since a fork clears the signal a process gets when its parent
dies), then every process it adopted: as the children's subreaper it is
the parent of whatever a body left behind in a child that has since ended,
even a process that left its group. Each child dies with the zygote
(``PR_SET_PDEATHSIG``), so no body outlives a worker that was killed.
SIGINT and SIGTERM are the worker's to act on: the zygote ignores them, and
a child catches them with a handler that does nothing (an ignored signal
would stay ignored in the programs a body runs; a handler does not survive
``exec``). A Ctrl-C or a supervisor's SIGTERM may reach every process, and
only the worker decides how its bodies end.

Messages on the control socket (a ``SOCK_SEQPACKET`` pair: one message per
send) are pickled tuples: the worker sends ``(SPAWN, index)`` with the
child's socket as an attached descriptor, and ``(KILL, index, pid, signum)``;
the zygote answers ``(SPAWNED, index, pid)``, ``(EXITED, index, pid, code)``
(``code`` as ``subprocess`` reports it: the exit status, or minus the
signal) and ``(OUTLIVED, index, pid, seq)``.
"""

import contextlib
import ctypes
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from leasejobs.worker.channel import socket_pair
from leasejobs.worker.slots import SlotTable

SPAWN = "spawn"
KILL = "kill"
SPAWNED = "spawned"
EXITED = "exited"
OUTLIVED = "outlived"

#: How often the zygote looks for bodies past their lease, and for children to reap.
WATCH_SECONDS = 0.05

#: How long a leaving zygote goes on killing and reaping what it leaves behind.
LEAVE_SECONDS = 2.0

#: ``prctl`` options: the signal this process gets when its parent dies; adopt orphans.
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

#: A child's ``/proc/self/oom_score_adj``: the kernel's out-of-memory killer
#: picks a child (whose body ate the memory) before the worker or the zygote.
CHILD_OOM_SCORE_ADJ = 500

#: What the zygote runs in a fresh child: ``(socket fd, child index) -> exit status``.
ChildMain = Callable[[int, int], int]


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux); exit now if it died already."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


class Zygote:
    """The worker's handle on its zygote."""

    def __init__(self, pid: int, ctl: socket.socket) -> None:
        self.pid = pid
        self.ctl = ctl
        self.lock = threading.Lock()

    @classmethod
    def start(
        cls, slots: SlotTable, child_main: ChildMain, *, bodies_per_child: int, watch: bool
    ) -> "Zygote":
        """Fork the zygote; call before the worker starts any thread.

        Child ``i`` runs the bodies of slots ``i * bodies_per_child`` and on.
        ``watch``: kill children whose body outlived its lease (off with
        ``--no-heartbeat``, whose leases are never renewed by design).
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        worker = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the zygote
            code = 70
            try:
                ours.close()
                if os.getppid() != worker:
                    os._exit(1)
                _own_group()
                code = _serve(theirs, slots, child_main, bodies_per_child, watch=watch)
            except BaseException:
                _print_exc()
            finally:
                os._exit(code)
        theirs.close()
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)  # as the zygote does: whichever of the two runs first
        ours.setblocking(False)
        return cls(pid, ours)

    def fileno(self) -> int:
        return self.ctl.fileno()

    def spawn(self, index: int) -> socket.socket:
        """Ask for a child in slot ``index``; returns the worker's end of its socket.

        The child's pid comes later, in a SPAWNED message.
        """
        ours, theirs = socket_pair()
        try:
            with self.lock:
                socket.send_fds(self.ctl, [pickle.dumps((SPAWN, index))], [theirs.fileno()])
        except OSError as exc:
            ours.close()
            raise RuntimeError(
                f"the zygote (pid {self.pid}) that forks this worker's children is gone ({exc})"
            ) from None
        finally:
            theirs.close()
        return ours

    def kill(self, index: int, pid: int, signum: int) -> None:
        """Send ``signum`` to child ``pid`` if it is still the zygote's child in ``index``
        (never to a process that took a reaped child's pid)."""
        with self.lock, contextlib.suppress(BlockingIOError, OSError):
            self.ctl.send(pickle.dumps((KILL, index, pid, signum)))

    def receive(self) -> list[tuple[Any, ...]] | None:
        """The zygote's messages so far; None once it is gone."""
        messages: list[tuple[Any, ...]] = []
        while True:
            try:
                data = self.ctl.recv(4096)
            except (BlockingIOError, InterruptedError):
                return messages
            except OSError:
                return messages or None
            if not data:
                return messages or None
            messages.append(pickle.loads(data))

    def stop(self, timeout: float = 5.0) -> None:
        """Close the control socket (the zygote kills its children and exits) and reap it."""
        with contextlib.suppress(OSError):
            self.ctl.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self.pid, os.WNOHANG)[0] != 0:
                    return
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


def _serve(
    ctl: socket.socket, slots: SlotTable, child_main: ChildMain, bodies_per_child: int, *, watch: bool
) -> int:
    """The zygote's loop: fork, reap, watch, until the worker closes the control socket or dies.

    It is its children's subreaper: a process a body forked and left behind
    is reparented to it when its child dies, and reaped here.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    me = os.getpid()
    worker = os.getppid()
    children: dict[int, int] = {}  # pid -> index
    killed: set[int] = set()  # pids the watchdog killed, not yet reaped
    try:
        while os.getppid() == worker:
            readable, _, _ = select.select([ctl], [], [], WATCH_SECONDS)
            if readable:
                try:
                    data, fds, _, _ = socket.recv_fds(ctl, 4096, 1)
                except OSError:
                    return 0
                if not data:
                    return 0
                message = pickle.loads(data)
                if message[0] == SPAWN:
                    index = message[1]
                    pid = _fork_child(fds[0], index, me, ctl, child_main)
                    children[pid] = index
                    _tell(ctl, (SPAWNED, index, pid))
                elif message[0] == KILL:
                    _, index, pid, signum = message
                    if children.get(pid) == index:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signum)
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            _reap(ctl, children, killed)
            if watch:
                _watch(ctl, slots, children, killed, bodies_per_child)
        return 0
    finally:
        _leave(children)


def _leave(children: dict[int, int]) -> None:
    """Kill each child's group, then whatever this subreaper adopted, reaping as it goes.

    The zygote's own group is the worker's (and its supervisor's): it is
    never signalled, only a process or the group a child leads.
    """
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + LEAVE_SECONDS
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        left = _own_children()
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _own_children() -> list[int]:
    """This process's children, adopted or forked (from ``/proc``)."""
    me = os.getpid()
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{me}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{me}/task/{task}/children") as f:
                found.extend(int(pid) for pid in f.read().split())
    return found


def _fork_child(fd: int, index: int, zygote: int, ctl: socket.socket, child_main: ChildMain) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        ctl.close()
        os.setpgid(0, 0)  # a group of its own: a kill takes what its bodies forked too
        die_with_parent(zygote)
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as adj:
            adj.write(str(CHILD_OOM_SCORE_ADJ))
        code = child_main(fd, index)
    except BaseException:
        _print_exc()
    finally:
        # Whatever a body did to sys.stdout (closed, None), this process ends
        # here: unwinding into the zygote's loop would run its clean-up, which
        # kills the sibling children.
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return 0  # never reached


def _own_group() -> None:
    """Lead a process group of its own: a stop of the worker's group (Ctrl-Z in a
    terminal, ``kill -STOP -<pgid>``) must not stop the watchdog too, while the
    children, each in a group of its own, run on past their leases."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def _print_exc() -> None:
    with contextlib.suppress(BaseException):
        traceback.print_exc()


def _reap(ctl: socket.socket, children: dict[int, int], killed: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        killed.discard(pid)
        index = children.pop(pid, None)
        if index is not None:  # else an orphan a body left behind, adopted and reaped
            _tell(ctl, (EXITED, index, pid, os.waitstatus_to_exitcode(status)))


def _watch(
    ctl: socket.socket, slots: SlotTable, children: dict[int, int], killed: set[int], per_child: int
) -> None:
    now = time.monotonic()
    for pid, index in children.items():
        if pid in killed:
            continue
        for slot in range(index * per_child, (index + 1) * per_child):
            seq = slots.outlived(slot, now)
            if seq:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                killed.add(pid)
                _tell(ctl, (OUTLIVED, index, pid, seq))
                break


def _tell(ctl: socket.socket, message: tuple[Any, ...]) -> None:
    """Tell the worker, never waiting: a paused worker must not stop the watchdog."""
    with contextlib.suppress(OSError):
        ctl.send(pickle.dumps(message), socket.MSG_DONTWAIT)
