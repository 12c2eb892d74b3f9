"""The vacuum thread's reading of a held xid (``Vacuumer._pin_released``), against scripted
looks and VACUUMs: it may only bring a VACUUM forward, and never into a loop."""

from collections.abc import Iterator

import pytest

from leasejobs.worker import vacuum as vacuum_module
from leasejobs.worker.events import Events
from leasejobs.worker.vacuum import Look, Vacuumer


class Scripted(Vacuumer):
    """A Vacuumer whose looks and VACUUMs are a model: ``kept`` dead rows survive a VACUUM."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__("t", Events("t"), threshold=100, scale_factor=0.0, pooled=False)
        self._allowed = True
        self.clock = clock
        self.dead = 0
        self.kept = 0  # what a VACUUM now leaves: all of it while something pins the horizon
        self.oldest_xid: int | None = None
        self.count = 0
        self.at: list[float] = []

    def _read(self) -> Look:
        return Look(self.dead, 1000, True, self.count, False, self.oldest_xid)

    def vacuum(self, conn: object) -> None:
        self.count += 1
        self.at.append(self.clock[0])
        self.dead = min(self.dead, self.kept)


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Scripted, list[float]]]:
    clock = [1000.0]
    monkeypatch.setattr(vacuum_module.time, "monotonic", lambda: clock[0])
    v = Scripted(clock)
    monkeypatch.setattr(vacuum_module.maintenance, "vacuum_jobs", v.vacuum)
    yield v, clock
    v.close()


def _seconds(v: Scripted, clock: list[float], n: int, *, dead_per_second: int, pinned: bool, xid) -> None:
    for _ in range(n):
        clock[0] += 1.0
        v.dead += dead_per_second
        if pinned:
            v.kept = v.dead
        else:
            v.kept = 0
        v.oldest_xid = xid() if callable(xid) else xid
        assert v.check()


def test_a_vacuum_comes_within_two_seconds_of_the_held_xid_ending(run) -> None:
    v, clock = run
    _seconds(v, clock, 2, dead_per_second=0, pinned=True, xid=42)  # an idle transaction holds xid 42
    _seconds(v, clock, 5, dead_per_second=500, pinned=True, xid=42)
    assert v.count == 1  # one VACUUM, in vain, then the back-off
    ended = clock[0]
    _seconds(v, clock, 3, dead_per_second=500, pinned=False, xid=None)
    assert v.count >= 2 and v.at[1] - ended <= 2.0
    assert v.dead <= 500


def test_xids_that_come_and_go_beside_a_snapshot_pin_do_not_make_vacuums_loop(run) -> None:
    """A report without an xid pins the horizon for five minutes while bodies hold xids of a
    few seconds each: the VACUUMs stay those of the back-off (15 s, 30 s, then a minute)."""
    v, clock = run
    xids = iter(range(1000, 10**6))
    current = [next(xids)]

    def xid() -> int:
        if int(clock[0]) % 3 == 0:  # each body's transaction lasts three seconds
            current[0] = next(xids)
        return current[0]

    _seconds(v, clock, 300, dead_per_second=500, pinned=True, xid=xid)
    assert v.count <= 8, v.at


def test_a_long_xid_never_holds_off_the_back_off_vacuums(run) -> None:
    """A snapshot kept the first VACUUM in vain while an unrelated xid was the oldest; the
    snapshot ends and that xid lives on: the back-off's VACUUM still comes and removes rows."""
    v, clock = run
    _seconds(v, clock, 2, dead_per_second=0, pinned=True, xid=7)
    _seconds(v, clock, 5, dead_per_second=500, pinned=True, xid=7)
    assert v.count == 1
    _seconds(v, clock, 120, dead_per_second=500, pinned=False, xid=7)
    assert v.count >= 2 and v.dead < 2000
