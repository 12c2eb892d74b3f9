"""Where a worker's claim starts (``leasejobs.worker.claim_start``): the keys it keeps
and when it walks from the front again."""

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from leasejobs.db.store import ClaimedRow, ClaimKey
from leasejobs.worker.claim_start import FRONT_GAP, FRONT_GAP_MAX_SECONDS, ClaimStart

T0 = datetime(2026, 12, 3, tzinfo=UTC)


def row(job_id: int, priority: int = 0, second: int = 0) -> ClaimedRow:
    return ClaimedRow(
        job_id, "t", "[]", "{}", 1, 1, 3, "default", None, "", True, False, 0.0, None, 0, None,
        priority=priority, run_at=T0 + timedelta(seconds=second),
    )  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_claim_walks_from_the_front_and_the_next_from_its_keys() -> None:
    clock = Clock()
    start = ClaimStart(clock)
    assert start.after() is None
    start.claimed(None, 100.0, 0.01, [row(1, 5, 0), row(2, 5, 1), row(3, 0, 0)], given_back=())
    assert start.after() == {5: ClaimKey(T0 + timedelta(seconds=1), 2), 0: ClaimKey(T0, 3)}
    assert start.after(front=True) is None


def test_a_front_walk_is_due_again_after_its_own_duration_times_the_gap() -> None:
    clock = Clock()
    start = ClaimStart(clock)
    start.claimed(None, 100.0, 0.5, [row(1)], given_back=())
    clock.now = 100.0 + FRONT_GAP * 0.5 - 0.001
    assert start.after() is not None
    # A claim from the keys does not move the front walk's time.
    start.claimed(start.after(), clock.now, 3.0, [row(2, second=1)], given_back=())
    clock.now = 100.0 + FRONT_GAP * 0.5
    assert start.after() is None


def test_a_front_walk_stretched_by_a_stall_delays_the_next_by_ten_seconds_at_most() -> None:
    """A claim's wall time includes a reconnect's back-off or a pause of the worker."""
    clock = Clock()
    start = ClaimStart(clock)
    start.claimed(None, 100.0, 30.0, [row(1)], given_back=())
    clock.now = 100.0 + FRONT_GAP_MAX_SECONDS - 0.001
    assert start.after() is not None
    clock.now = 100.0 + FRONT_GAP_MAX_SECONDS
    assert start.after() is None


def test_a_job_given_back_stays_after_its_prioritys_key() -> None:
    start = ClaimStart(Clock())
    start.claimed(None, 100.0, 0.01, [row(1), row(2), row(3), row(4)], given_back={3, 4})
    assert start.after() == {0: ClaimKey(T0, 2)}
    # A front walk may go back: the key follows what it kept.
    start.claimed(None, 100.0, 0.01, [row(7, second=-5)], given_back={7})
    assert start.after() == {0: ClaimKey(T0 - timedelta(seconds=5), 6)}


@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.sampled_from([0, 5]), max_size=4),  # new jobs, due after every job before them
            st.booleans(),  # the claim walks from the front
            st.integers(0, 6),  # how many of the claimable jobs it takes (a prefix, as the LIMIT)
            st.lists(st.booleans(), max_size=6),  # which of those go back to the queue
        ),
        max_size=8,
    )
)
def test_no_queued_job_is_ever_behind_its_prioritys_key(
    steps: list[tuple[list[int], bool, int, list[bool]]],
) -> None:
    """Against a model of the claim: whatever each claim takes (a prefix of what it can
    see, in claim order) and gives back, every job still queued is after its priority's
    key, so the next claim from the keys finds it (jobs due before the keys, by design
    found by the front walks only, are not made here)."""
    clock = Clock()
    start = ClaimStart(clock)
    queued: list[ClaimedRow] = []
    next_id = 1
    for new, front, taken, back in steps:
        for priority in new:
            queued.append(row(next_id, priority, second=next_id))
            next_id += 1
        keys = None if front else start.after()
        visible = [
            r for r in queued if keys is None or (r.priority in keys and (r.run_at, r.id) > keys[r.priority])
        ]
        rows = sorted(visible, key=lambda r: (-r.priority, r.run_at, r.id))[:taken]
        gone = {r.id for r, b in zip(rows, back, strict=False) if b}
        start.claimed(keys, clock.now, 1.0, rows, given_back=gone)
        queued = [r for r in queued if r not in rows or r.id in gone]
        after = start.after() or {}
        for r in queued:
            if r.priority in after:
                assert (r.run_at, r.id) > tuple(after[r.priority])
