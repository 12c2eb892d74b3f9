"""The body slots: what the worker, its children and the zygote share without a message.

One ``Slot`` per body a worker can run at once (``--concurrency``), in an
anonymous shared memory map made before the zygote is forked, so the
supervisor, the zygote and every child see the same bytes. Each field has
exactly one writer and is a single aligned 8-byte word, so a reader sees a
whole value, never half of one (no lock: a lock held by a child that is
SIGKILLed would be held forever):

- the child writes ``running`` (the assignment number of the job whose body
  runs now, 0 between bodies), ``started`` (the highest assignment number
  whose body has started, written *before* the body starts), ``started_at``
  (monotonic) and ``block`` (inside a side-effect block: 1 when the job holds
  no place under a limit, so its locked row protects it; 2 when it does),
  ``block_seq``/``block_deadline`` (the lease a side-effect block renewed);
- the child also keeps in ``kept_seq``/``kept_seconds`` (a ring of
  ``KEPT_RING`` entries, ``kept_count`` written last) the bodies that ended
  plainly done whose report it has not sent yet: it sends reports once a
  millisecond rather than one write per body, and a neighbour that kills
  the process must not take those outcomes with it (``kept``: the
  supervisor reads them when the child dies, and while it lives, in case a
  long body delays the child's next report);
- the supervisor writes ``deadline`` (monotonic time until which every lease
  of the jobs it gave this body surely holds, 0: no limit) and ``flag_seq``/
  ``flags`` (lease lost, cancel requested, timed out: for the job with that
  assignment number only), and ``revoke_upto`` (no job up to that assignment
  number may start any more: ``SlotTable.revoke``);
- the zygote reads them and kills a child whose running body outlived its
  lease (the supervisor may be paused and unable to do it).

Assignment numbers are per child and only grow, so a flag or a deadline
written for one job never applies to the next.
"""

import ctypes
import mmap
from dataclasses import dataclass

#: Flags the supervisor raises for one running job (``Slot.flags``).
LEASE_LOST = 1
CANCEL_REQUESTED = 2
TIMED_OUT = 4
#: The worker is stopping and its grace is over: the body is stopped.
STOPPED = 8

#: ``Slot.block``: not inside a side-effect block; inside one of a job without
#: places (its locked row keeps any claim away, so the lease may run out);
#: inside one of a job holding places (its places can still run out).
NO_BLOCK = 0
BLOCK_ROW_LOCKED = 1
BLOCK_WITH_PLACES = 2


#: How long after ``SlotTable.revoke`` the supervisor reads which of the jobs it revoked
#: have started: a store made before the write is long visible by then (store buffers
#: drain in well under a microsecond; a process switched out drains them first).
REVOKE_SETTLE_SECONDS = 0.02

#: How many plainly done bodies a child keeps in its slot before it must send their reports.
KEPT_RING = 64


class Slot(ctypes.Structure):
    _fields_ = [
        ("running", ctypes.c_int64),
        ("started", ctypes.c_int64),
        ("started_at", ctypes.c_double),
        ("block", ctypes.c_int64),
        ("block_seq", ctypes.c_int64),
        ("block_deadline", ctypes.c_double),
        ("deadline", ctypes.c_double),
        ("flag_seq", ctypes.c_int64),
        ("flags", ctypes.c_int64),
        ("revoke_upto", ctypes.c_int64),
        ("kept_count", ctypes.c_int64),
        ("kept_seq", ctypes.c_int64 * KEPT_RING),
        ("kept_seconds", ctypes.c_double * KEPT_RING),
    ]


@dataclass(frozen=True)
class Running:
    """A body running now in a slot: its assignment number and when it started."""

    seq: int
    started_at: float


class SlotTable:
    """``count`` slots in one shared map (inherited by forked processes)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._map = mmap.mmap(-1, max(1, count) * ctypes.sizeof(Slot))
        table = (Slot * count).from_buffer(self._map)
        #: Each slot's view and its ring's, made once: indexing a ctypes array makes a new
        #: object each time, half the cost of a child's ``keep_done`` per body.
        self._slots: list[Slot] = [table[i] for i in range(count)]
        self._rings = [(slot.kept_seq, slot.kept_seconds) for slot in self._slots]

    def __getitem__(self, index: int) -> Slot:
        slot: Slot = self._slots[index]
        return slot

    def reset(self, index: int) -> None:
        """A fresh child takes the slot: nothing runs, nothing is due, no flag."""
        ctypes.memset(ctypes.addressof(self._slots[index]), 0, ctypes.sizeof(Slot))

    # -- read by the supervisor ------------------------------------------------

    def running(self, index: int) -> Running | None:
        """The body running in the slot now, or None between bodies."""
        slot = self._slots[index]
        seq = slot.running
        started_at = slot.started_at
        if seq == 0 or slot.running != seq:
            return None
        return Running(seq, started_at)

    # -- written by the supervisor ---------------------------------------------

    def raise_flag(self, index: int, seq: int, flag: int) -> bool:
        """Raise ``flag`` for the job with assignment number ``seq`` (one writer: the supervisor,
        under its own lock); whether it was raised. Flags only ever go up for one job; the
        child remembers what it saw.

        The slot holds one job's flags. Those of the body running in it are never
        replaced by a job queued behind it: a cancel of the next job would wipe a
        running body's cancel or timeout (a job not started is revoked instead, and
        its flag raised again once it runs).
        """
        slot = self._slots[index]
        if slot.flag_seq != seq:
            held = slot.flag_seq
            if held and slot.flags and slot.running == held and seq != held:
                return False
            slot.flags = 0
            slot.flag_seq = seq
        slot.flags = slot.flags | flag
        return True

    def revoke(self, index: int, upto: int) -> None:
        """No job of the slot's child up to assignment number ``upto`` starts from now on.

        The child reads this after it wrote ``started`` for a body, before the
        body starts (``Child._run_one``). The supervisor reads ``started``
        only ``REVOKE_SETTLE_SECONDS`` later: a job not started by then never
        starts, and the supervisor may give it to another child or back to the
        queue while the child still runs the body before it. One write each,
        no lock: a store is seen by the other process long before that.
        """
        slot = self._slots[index]
        slot.revoke_upto = max(slot.revoke_upto, upto)

    def set_deadline(self, index: int, deadline: float) -> None:
        self._slots[index].deadline = deadline

    # -- read by the child ------------------------------------------------------

    def flags(self, index: int, seq: int) -> int:
        """The flags raised for the job ``seq`` (0 if none, or if they are another job's)."""
        return flags_of(self._slots[index], seq)

    def keep_done(self, index: int, seq: int, seconds: float) -> None:
        """Keep the job ``seq`` as plainly done in ``seconds`` (the child; its report is not sent
        yet). The entry is written before the count that makes it one: a child killed
        between the two has kept nothing."""
        slot = self._slots[index]
        count = slot.kept_count
        seqs, times = self._rings[index]
        seqs[count % KEPT_RING] = seq
        times[count % KEPT_RING] = seconds
        slot.kept_count = count + 1

    # -- read by the supervisor once the child is dead ----------------------------

    def kept(self, index: int, since: int = 0) -> tuple[int, dict[int, float]]:
        """The slot's count of kept bodies, and the jobs its child kept as plainly done from the
        ``since``-th on (the last ``KEPT_RING`` at most), with their bodies' seconds.

        Read once the child is dead, or while it lives: every entry is a job
        whose body ended done, whichever entry is read."""
        slot = self._slots[index]
        count = slot.kept_count
        return count, {
            slot.kept_seq[i % KEPT_RING]: slot.kept_seconds[i % KEPT_RING]
            for i in range(max(since, count - KEPT_RING), count)
        }

    # -- read by the zygote -----------------------------------------------------

    def outlived(self, index: int, now: float) -> int:
        """The assignment number of a body running past its lease (0: none).

        A body inside a side-effect block of a job without places is never
        reported: its block holds the job row, so no claim can take it over
        however long the block lasts. The lease a block renewed as it
        committed counts too (the supervisor hears of it only at its next look).
        """
        slot = self._slots[index]
        seq = slot.running
        if seq == 0:
            return 0
        deadline = slot.deadline
        if deadline <= 0 or slot.block == BLOCK_ROW_LOCKED:
            return 0
        if slot.block_seq == seq:
            deadline = max(deadline, slot.block_deadline)
        return seq if now > deadline and slot.running == seq else 0


def flags_of(slot: Slot, seq: int) -> int:
    """The flags raised in ``slot`` for the job ``seq`` (0 if none, or if they are another job's).

    The job's number is read before and after the flags: a flag written for
    the next job between the two reads is not taken for this one's.
    """
    flag_seq = slot.flag_seq
    flags = slot.flags
    return flags if flag_seq == seq and slot.flag_seq == seq else 0
