"""A child's shared slot: the ring of plainly done bodies a dead child's worker still finds
there, and the one job's flags the child reads."""

from leasejobs.worker.slots import CANCEL_REQUESTED, KEPT_RING, TIMED_OUT, SlotTable


def test_the_ring_holds_the_last_kept_bodies_and_a_fresh_child_starts_it_empty():
    slots = SlotTable(2)
    assert slots.kept(0) == (0, {})
    for seq in range(1, KEPT_RING + 11):
        slots.keep_done(0, seq, seq / 1000)
    count, kept = slots.kept(0)
    # The oldest ten were overwritten: a child sends its reports before it keeps more.
    assert count == KEPT_RING + 10
    assert sorted(kept) == list(range(11, KEPT_RING + 11))
    assert kept[KEPT_RING + 10] == (KEPT_RING + 10) / 1000
    # From a count on: what the pool thread has not read yet.
    assert sorted(slots.kept(0, since=KEPT_RING + 7)[1]) == [KEPT_RING + 8, KEPT_RING + 9, KEPT_RING + 10]
    assert slots.kept(1) == (0, {})
    slots.reset(0)
    assert slots.kept(0) == (0, {})


def test_a_flag_for_the_job_queued_behind_a_running_body_never_wipes_that_bodys_flags():
    """Review 51: a cancel of the job waiting behind a timed-out body wiped its TIMED_OUT,
    and the stopped body's side effect committed. The queued job's flag is refused (the
    worker revokes that job and raises it again once it runs); the running body keeps its own."""
    slots = SlotTable(1)
    slots[0].running = 5
    assert slots.raise_flag(0, 5, TIMED_OUT)
    assert not slots.raise_flag(0, 6, CANCEL_REQUESTED)
    assert (slots.flags(0, 5), slots.flags(0, 6)) == (TIMED_OUT, 0)
    assert slots.raise_flag(0, 5, CANCEL_REQUESTED)
    assert slots.flags(0, 5) == TIMED_OUT | CANCEL_REQUESTED
    # That body over and the next one running, its flag goes up in place of the last one's.
    slots[0].running = 6
    assert slots.raise_flag(0, 6, CANCEL_REQUESTED)
    assert (slots.flags(0, 5), slots.flags(0, 6)) == (0, CANCEL_REQUESTED)


def test_a_flag_for_a_queued_job_goes_up_while_no_flagged_body_runs():
    """Between bodies, or beside a running body with no flag, the slot takes any job's flag."""
    slots = SlotTable(1)
    assert slots.raise_flag(0, 3, CANCEL_REQUESTED)
    slots[0].running = 2
    assert slots.raise_flag(0, 4, CANCEL_REQUESTED)
    assert slots.flags(0, 4) == CANCEL_REQUESTED
