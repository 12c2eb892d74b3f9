"""The slot's ring of plainly done bodies: what a dead child's worker still finds there."""

from leasejobs.worker.slots import KEPT_RING, SlotTable


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
