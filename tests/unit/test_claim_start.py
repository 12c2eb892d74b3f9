"""Where a worker's claim starts (``leasejobs.worker.claim_start``): the keys it keeps
and when it walks from the front again."""

from datetime import UTC, datetime, timedelta
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from leasejobs.db.store import ClaimedRow, ClaimKey
from leasejobs.worker import claim_start
from leasejobs.worker.claim_start import (
    ASKED_WALK_GAP_SECONDS,
    COSTLY_IN_A_ROW,
    FRONT_GAP,
    FRONT_GAP_MAX_SECONDS,
    INLINE_SECONDS,
    PER_ROW_SECONDS,
    ClaimStart,
)

T0 = datetime(2026, 12, 3, tzinfo=UTC)
#: How long a walk from the front takes under a pinned horizon: more than the claimer makes itself.
COSTLY = 0.5


def row(job_id: int, priority: int = 0, second: int = 0) -> ClaimedRow:
    return ClaimedRow(
        job_id, "t", "[]", "{}", 1, 1, 3, "default", None, "", True, False, 0.0, None, 0, None,
        priority=priority, run_at=T0 + timedelta(seconds=second),
    )  # fmt: skip


def pinned(start: ClaimStart) -> ClaimStart:
    """Walks from the front made costly so far, one short of handing the next to a look
    (as under a pinned horizon: the test's own costly walk is then the last of the row)."""
    for _ in range(COSTLY_IN_A_ROW - 1):
        start.claimed(None, 0.0, COSTLY, [], given_back=())
    return start


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


def test_a_front_look_is_due_after_its_own_duration_times_the_gap_and_one_at_a_time() -> None:
    clock = Clock()
    start = pinned(ClaimStart(clock))
    start.claimed(None, 100.0, 0.5, [row(1)], given_back=())
    clock.now = 100.0 + FRONT_GAP * 0.5 - 0.001
    assert start.look_due() is None
    # A claim from the keys does not move the look's time, and never waits for it.
    start.claimed(start.after(), clock.now, 3.0, [row(2, second=1)], given_back=())
    clock.now = 100.0 + FRONT_GAP * 0.5
    assert start.look_due() == {0: ClaimKey(T0 + timedelta(seconds=1), 2)}
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=1), 2)}
    assert start.look_due() is None  # one under way
    assert not start.looked(0.25, [])
    assert start.look_due() is None
    clock.now += FRONT_GAP * 0.25
    assert start.look_due() is not None


def test_a_front_look_stretched_by_a_stall_delays_the_next_by_ten_seconds_at_most() -> None:
    """A look's wall time includes a reconnect's back-off or a pause of the worker."""
    clock = Clock()
    start = pinned(ClaimStart(clock))
    start.claimed(None, 100.0 - FRONT_GAP * COSTLY, COSTLY, [row(1)], given_back=())
    assert start.look_due() is not None
    start.looked(30.0, [])
    clock.now = 100.0 + FRONT_GAP_MAX_SECONDS - 0.001
    assert start.look_due() is None
    clock.now = 100.0 + FRONT_GAP_MAX_SECONDS
    assert start.look_due() is not None


def test_what_a_look_found_moves_its_prioritys_key_to_just_before_it() -> None:
    start = pinned(ClaimStart(Clock()))
    start.claimed(None, 100.0 - FRONT_GAP * COSTLY, COSTLY, [row(5, second=5)], given_back=())
    assert start.look_due() is not None
    early = ClaimKey(T0 - timedelta(seconds=60), 2)
    assert start.looked(0.01, [(0, early), (7, ClaimKey(T0, 9))])
    assert start.after() == {0: ClaimKey(early.run_at, 1), 7: ClaimKey(T0, 8)}


def test_a_key_that_went_back_during_a_look_keeps_its_place() -> None:
    """A job given back during the look may lie before what the look found."""
    start = pinned(ClaimStart(Clock()))
    start.claimed(
        None, 100.0 - FRONT_GAP * COSTLY, COSTLY, [row(5, second=5), row(6, 3, second=5)], given_back=()
    )
    assert start.look_due() is not None
    start.claimed(start.after(), 100.0, 0.01, [row(7, second=6), row(8, second=7)], given_back={7})
    assert start.looked(0.01, [(0, ClaimKey(T0, 3)), (3, ClaimKey(T0, 4))])
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=6), 6), 3: ClaimKey(T0, 3)}


def test_a_key_that_goes_back_before_the_claimer_takes_a_finding_in_keeps_its_place() -> None:
    start = pinned(ClaimStart(Clock()))
    start.claimed(None, 100.0 - FRONT_GAP * COSTLY, COSTLY, [row(5, second=5)], given_back=())
    keys = start.look_due()
    assert keys is not None
    assert start.looked(0.01, [(0, ClaimKey(T0, 3))])
    # The claim that was under way when the look ended gave a job back.
    start.claimed(keys, 100.0, 0.01, [row(7, second=6)], given_back={7})
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=6), 6)}


def test_a_claim_from_the_front_makes_the_look_under_way_moot() -> None:
    start = pinned(ClaimStart(Clock()))
    start.claimed(None, 100.0 - FRONT_GAP * COSTLY, COSTLY, [row(5, second=5)], given_back=())
    assert start.look_due() is not None
    start.claimed(None, 100.0, 0.0, [row(9, second=9)], given_back=())
    assert not start.looked(0.01, [(0, ClaimKey(T0, 3))])
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=9), 9)}


def test_walks_from_the_front_go_to_a_look_after_three_costly_ones_in_a_row() -> None:
    """One walk stretched by a busy machine stays the claimer's; a row of them (a pinned
    horizon) hands the next to a look, and one cheap look hands it back."""
    clock = Clock()
    start = ClaimStart(clock)
    start.claimed(None, 100.0, INLINE_SECONDS / 2, [row(1)], given_back=())
    clock.now = 100.0 + FRONT_GAP * INLINE_SECONDS
    assert start.look_due() is None
    assert start.after() is None  # due and cheap: the claimer walks from the front itself
    for n in range(1, COSTLY_IN_A_ROW + 1):
        start.claimed(None, clock.now, COSTLY, [row(1 + n, second=n)], given_back=())
        clock.now += FRONT_GAP * COSTLY
        if n < COSTLY_IN_A_ROW:
            assert start.look_due() is None
            assert start.after() is None  # costly, but not yet a row of them: its own
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=COSTLY_IN_A_ROW), 1 + COSTLY_IN_A_ROW)}
    assert start.look_due() is not None  # due, a row of costly walks: a look's
    assert not start.looked(INLINE_SECONDS / 2, [])  # the look found it cheap again
    clock.now += FRONT_GAP * INLINE_SECONDS
    assert start.look_due() is None
    assert start.after() is None


def test_a_walk_that_claimed_many_jobs_counts_their_claim_as_no_cost_of_the_walk() -> None:
    """A healthy claim from the front of hundreds of jobs takes tens of ms; the walk itself
    is what is left after PER_ROW_SECONDS a job."""
    clock = Clock()
    start = ClaimStart(clock)
    many = [row(n, second=n) for n in range(1, 201)]
    for _ in range(COSTLY_IN_A_ROW):
        start.claimed(None, clock.now, INLINE_SECONDS + 150 * PER_ROW_SECONDS, many, given_back=())
        clock.now += 10.0
    assert start.look_due() is None
    assert start.after() is None
    for _ in range(COSTLY_IN_A_ROW):
        start.claimed(None, clock.now, INLINE_SECONDS + 250 * PER_ROW_SECONDS, many, given_back=())
        clock.now += 10.0
    assert start.look_due() is not None


def test_a_stuck_look_gives_the_walk_back_to_the_claimer_and_a_failed_one_too() -> None:
    clock = Clock()
    start = pinned(ClaimStart(clock))
    start.claimed(None, 100.0 - FRONT_GAP * COSTLY, COSTLY, [row(1)], given_back=())
    assert start.look_due() is not None
    clock.now += FRONT_GAP_MAX_SECONDS
    assert start.after() is not None
    clock.now += 0.001
    assert start.after() is None  # the look's backend hangs: no job waits for it for ever
    start.claimed(None, clock.now, COSTLY, [row(2, second=1)], given_back=())
    assert not start.looked(0.2, [(0, ClaimKey(T0, 0))], failed=True)  # moot: a walk since
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=1), 2)}
    clock.now += FRONT_GAP * COSTLY
    assert start.look_due() is None  # after a failure the claimer walks itself
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


@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.sampled_from([0, 5]), max_size=3),  # new jobs, due after every job before them
            st.lists(st.sampled_from([0, 5]), max_size=2),  # late jobs, due before every job before them
            st.booleans(),  # the claim walks from the front
            st.integers(0, 6),  # how many of the jobs it can see it takes (a prefix)
            st.lists(st.booleans(), max_size=6),  # which of those go back to the queue
            st.sampled_from(["none", "begin", "end"]),  # a front look begins or ends after the claim
            st.booleans(),  # a walk from the front costs more than the claimer makes itself
        ),
        max_size=10,
    )
)
def test_keys_never_skip_a_job_and_a_look_brings_back_what_lies_before_them(
    steps: list[tuple[list[int], list[int], bool, int, list[bool], str, bool]],
) -> None:
    """Against a model of the claims and the looks (each sees the queue as it was when it
    began, and finds per priority the first job at or before the key it was given): a
    job a claim from the keys can see stays visible until a claim takes it; a job queued
    when a look began, whose priority's key went nowhere back meanwhile, is visible once
    the claimer took the look's findings in."""
    clock = Clock()
    start = ClaimStart(clock)
    queued: list[ClaimedRow] = []
    next_id = 1
    look: tuple[dict[int, ClaimKey], list[ClaimedRow]] | None = None
    voided: set[int] | None = set()  # priorities whose key went back during the look (None: all)
    owed: list[ClaimedRow] = []  # queued when a finished look began; its priority's key did not go back

    def visible(keys: dict[int, ClaimKey] | None, r: ClaimedRow) -> bool:
        return keys is None or (r.priority in keys and (r.run_at, r.id) > tuple(keys[r.priority]))

    for new, late, front, taken, back, event, costly in steps:
        for priority in new:
            queued.append(row(next_id, priority, second=next_id))
            next_id += 1
        for priority in late:
            queued.append(row(next_id, priority, second=-next_id))
            next_id += 1
        keys = None if front else start.after()
        front = keys is None  # asked for, or the claimer's own walk
        seen = [r for r in queued if keys is not None and visible(keys, r)]
        rows = sorted([r for r in queued if visible(keys, r)], key=lambda r: (-r.priority, r.run_at, r.id))[
            :taken
        ]
        gone = {r.id for r, b in zip(rows, back, strict=False) if b}
        went_back = {r.priority for r in rows if r.id in gone}
        start.claimed(keys, clock.now, COSTLY if costly else 0.0, rows, given_back=gone)
        queued = [r for r in queued if r not in rows or r.id in gone]
        after = start.after()
        if after is None:  # a walk is due and the claimer makes it: the model's next claim does
            after = dict(start._keys)
        assert after is not None or not rows
        for r in seen:
            if r in queued and after is not None:
                assert visible(after, r), "a key moved past a job no claim took"
        if front:
            owed = []
            voided = None
        elif voided is not None:
            voided |= went_back
        owed = [r for r in owed if r in queued and r.priority not in went_back]
        for r in owed:
            assert visible(after, r), "a look's finding was lost"
        if event == "begin" and look is None:
            clock.now += 100.0
            keys_sent = start.look_due()
            if keys_sent is not None:
                look = (keys_sent, list(queued))
                voided = set()
        elif event == "end" and look is not None:
            keys_sent, snapshot = look
            found: dict[int, ClaimKey] = {}
            for r in sorted(snapshot, key=lambda r: (r.run_at, r.id)):
                key = keys_sent.get(r.priority)
                if r.priority not in found and (key is None or (r.run_at, r.id) <= tuple(key)):
                    found[r.priority] = ClaimKey(r.run_at, r.id)
            start.looked(COSTLY if costly else 0.0, found.items())
            look = None
            owed = [r for r in snapshot if r in queued and voided is not None and r.priority not in voided]
            after = start.after()
            for r in owed:
                assert visible(after, r), "a look's finding was lost"


def test_a_job_heard_of_behind_its_prioritys_key_moves_the_key_back_to_just_before_it() -> None:
    start = ClaimStart(Clock())
    start.claimed(None, 100.0, 0.01, [row(5, second=5), row(9, 5, second=9)], given_back=())
    assert start.heard([(0, ClaimKey(T0 + timedelta(seconds=2), 3))])  # committed late: behind the key
    # After the key (a job due later, one committed at once): nothing moves, so a
    # NOTIFY of a job not yet due wakes no claim (``Claimer.notified``).
    assert not start.heard([(0, ClaimKey(T0 + timedelta(seconds=8), 8))])
    # A priority no claim took from gets a key; the job lies behind none.
    assert not start.heard([(3, ClaimKey(T0, 7))])
    assert start.after() == {
        0: ClaimKey(T0 + timedelta(seconds=2), 2),
        5: ClaimKey(T0 + timedelta(seconds=9), 9),
        3: ClaimKey(T0, 6),
    }


def test_a_job_heard_of_before_any_claim_leaves_the_next_claim_to_the_front() -> None:
    start = ClaimStart(Clock())
    start.heard([(0, ClaimKey(T0, 3))])
    assert start.after() is None


def test_a_walk_from_the_front_asked_for_is_the_next_claims_whatever_walks_cost() -> None:
    """A queue resumed: its jobs lie behind the keys, and the walk is made at once, even
    when walks are costly enough to be a look's, and only once."""
    clock = Clock()
    start = ClaimStart(clock)
    for _ in range(COSTLY_IN_A_ROW):
        start.claimed(None, clock.now, COSTLY, [row(5, second=5)], given_back=())
    assert start.after() is not None  # walks are the look's now
    start.walk_front()
    after = start.after()
    assert after is None
    start.claimed(after, clock.now, COSTLY, [row(5, second=6)], given_back=())
    assert start.after() is not None


def test_walks_asked_for_are_a_second_apart_and_one_that_came_back_full_is_asked_again() -> None:
    """A program sending ``front`` in a loop makes one walk a second, not one a claim; a
    walk whose room higher priorities filled leaves the priorities after them for the
    next (review 7)."""
    clock = Clock()
    start = pinned(ClaimStart(clock))  # walks are costly: the regular ones are a look's
    start.claimed(None, clock.now, COSTLY, [row(5, second=5)], given_back=())
    start.walk_front()
    assert start.after() is None
    start.claimed(None, clock.now, COSTLY, [row(9, 9, second=9)], given_back=(), full=True)
    start.walk_front()
    assert start.after() is not None  # within the second: from the keys
    clock.now += ASKED_WALK_GAP_SECONDS
    after = start.after()
    assert after is None  # the one asked again
    start.claimed(after, clock.now, COSTLY, [row(9, 9, second=9)], given_back=(), full=False)
    clock.now += ASKED_WALK_GAP_SECONDS
    assert start.after() is not None  # it came back short: every job before the keys seen


def test_a_claim_under_way_when_a_late_job_is_heard_of_does_not_move_the_key_past_it() -> None:
    """The claim read the queue before the late job committed: its last row lies after
    the job, and must not carry the key past it."""
    start = ClaimStart(Clock())
    start.claimed(None, 100.0, 0.01, [row(1, second=1)], given_back=())
    keys = start.after()
    start.heard([(0, ClaimKey(T0 + timedelta(seconds=2), 2))])  # from the listener's thread
    start.claimed(keys, 100.0, 0.01, [row(3, second=3), row(4, second=4)], given_back=())
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=2), 1)}
    # The next claim took it: the keys move on.
    start.claimed(start.after(), 100.0, 0.01, [row(2, second=2), row(5, second=5)], given_back=())
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=5), 5)}


def test_a_job_heard_of_during_a_claim_that_took_it_leaves_the_key_after_the_claim() -> None:
    """The NOTIFY of a job the claim under way took costs the next claim nothing: its key
    stays at the claim's last row, not before the job (re-walking the rows just taken)."""
    start = ClaimStart(Clock())
    start.claimed(None, 100.0, 0.01, [row(1, second=1)], given_back=())
    keys = start.after()
    start.heard([(0, ClaimKey(T0 + timedelta(seconds=2), 2))])
    start.claimed(keys, 100.0, 0.01, [row(2, second=2), row(3, second=3)], given_back=())
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=3), 3)}


def test_a_late_job_heard_of_keeps_what_a_look_found_before_it_and_voids_the_look_under_way() -> None:
    clock = Clock()
    start = pinned(ClaimStart(clock))
    start.claimed(None, 100.0, COSTLY, [row(9, second=9)], given_back=())
    clock.now += 100.0
    assert start.look_due() is not None
    assert start.looked(COSTLY, [(0, ClaimKey(T0 + timedelta(seconds=1), 1))])  # found, not taken in yet
    clock.now += 100.0
    assert start.look_due() is not None  # another look begins
    start.heard([(0, ClaimKey(T0 + timedelta(seconds=4), 4))])
    start.looked(COSTLY, [(0, ClaimKey(T0 + timedelta(seconds=6), 6))])  # began before the job was heard of
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=1), 0)}


def test_keys_that_cannot_be_compared_stay_where_they_are() -> None:
    start = ClaimStart(Clock())
    start.claimed(None, 100.0, 0.01, [row(5, second=5)], given_back=())
    start.heard([(0, ClaimKey("06/12/2026 01:30:00 UTC", 3))])  # DateStyle SQL: not ISO
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=5), 5)}


HEARD_STEPS = st.lists(
    st.tuples(
        st.lists(st.sampled_from([0, 5]), max_size=3),  # new jobs, due after every job before them
        st.lists(st.tuples(st.sampled_from([0, 5]), st.integers(-20, 20)), max_size=2),  # late jobs
        st.booleans(),  # their NOTIFY comes while the claim is under way (else before it)
        st.booleans(),  # the claim walks from the front
        st.integers(0, 6),  # how many of the jobs it can see it takes (a prefix)
        st.lists(st.booleans(), max_size=6),  # which of those go back to the queue
    ),
    max_size=10,
)


@given(steps=HEARD_STEPS)
def test_every_job_heard_of_is_seen_by_the_next_claim(
    steps: list[tuple[list[int], list[tuple[int, int]], bool, bool, int, list[bool]]],
) -> None:
    _heard_of_and_seen(steps)


@given(steps=HEARD_STEPS)
def test_every_job_heard_of_is_seen_by_the_next_claim_when_only_the_earliest_are_kept(
    steps: list[tuple[list[int], list[tuple[int, int]], bool, bool, int, list[bool]]],
) -> None:
    """The same with ``HEARD_KEPT`` at 1: past it, only the earliest job heard of per
    priority is kept (bounded memory), and still no job heard of is skipped."""
    with mock.patch.object(claim_start, "HEARD_KEPT", 1):
        _heard_of_and_seen(steps)


def _heard_of_and_seen(
    steps: list[tuple[list[int], list[tuple[int, int]], bool, bool, int, list[bool]]],
) -> None:
    """Against a model of the claim: jobs that commit late (anywhere in claim order, before
    or behind the keys and the jobs a claim under way takes), announced by their
    NOTIFY before a claim or while one is under way (which then cannot see them), are
    never behind their priority's key until a claim takes them, whatever the claims take
    and give back (a job of a priority with no key yet is the walks' from the front, by
    design, and is not held to it)."""
    clock = Clock()
    start = ClaimStart(clock)
    queued: list[ClaimedRow] = []
    heard: list[ClaimedRow] = []
    next_id = 1

    def visible(keys: dict[int, ClaimKey] | None, r: ClaimedRow) -> bool:
        return keys is None or (r.priority in keys and (r.run_at, r.id) > tuple(keys[r.priority]))

    def announce(jobs: list[tuple[int, int]]) -> None:
        nonlocal next_id
        late = [row(next_id + i, p, second=second) for i, (p, second) in enumerate(jobs)]
        next_id += len(late)
        # A priority with no key yet is the walks' from the front (the key a job heard of
        # gives it starts at that job): only the jobs of keyed priorities are held to it.
        keyed = [r for r in late if r.priority in start._keys]
        start.heard([(r.priority, ClaimKey(r.run_at, r.id)) for r in late])
        queued.extend(late)
        heard.extend(keyed)

    for new, late, during, front, taken, back in steps:
        for priority in new:
            queued.append(row(next_id, priority, second=next_id))
            next_id += 1
        if not during:
            announce(late)
        keys = None if front else start.after()
        rows = sorted([r for r in queued if visible(keys, r)], key=lambda r: (-r.priority, r.run_at, r.id))[
            :taken
        ]
        if during:
            announce(late)
        gone = {r.id for r, b in zip(rows, back, strict=False) if b}
        start.claimed(keys, clock.now, 1.0, rows, given_back=gone)  # the next walk due in 10 s
        queued = [r for r in queued if r not in rows or r.id in gone]
        after = start.after()
        for r in heard:
            if r in queued:
                assert visible(after, r), "a job heard of is behind its priority's key"


def test_a_worker_that_claims_nothing_keeps_what_it_hears_in_bounded_memory() -> None:
    """A worker with no room claims nothing while jobs are announced: it keeps the first
    ``HEARD_KEPT`` of them, then the earliest per priority, and its next claim starts
    before the earliest of all."""
    start = ClaimStart(Clock())
    start.claimed(None, 100.0, 0.01, [row(1, second=100_000)], given_back=())
    start.after()  # the claim under way, which takes nothing
    start.heard([(0, ClaimKey(T0 + timedelta(seconds=n), n)) for n in range(50_000, 2, -1)])
    assert len(start._heard) <= claim_start.HEARD_KEPT
    start.claimed({0: ClaimKey(T0 + timedelta(seconds=100_000), 1)}, 100.0, 0.01, [], given_back=())
    assert start.after() == {0: ClaimKey(T0 + timedelta(seconds=3), 2)}
