"""A share-partition's dead letters (KIP-1191, `core.share.partition`): what goes ARCHIVING and in
which order, what a reload keeps, and the in-flight bound that keeps dead letters bounded."""
from __future__ import annotations

from oncelog.core.share.partition import (
    ACCEPT,
    ARCHIVED,
    ARCHIVING,
    AVAILABLE,
    PAST_LIMIT,
    REJECT,
    REJECTED,
    RELEASE,
    DeadLetter,
    SharePartition,
)

LOCK = 100


def fill(sp: SharePartition, n: int, member: str = "m", now: int = 0) -> list[int]:
    got = sp.acquire(member, [(0, n - 1, True)], n, now, LOCK)
    return [o for a in got for o in range(a.first_offset, a.last_offset + 1)]


def test_without_a_dead_letter_topic_rejected_records_are_archived_at_once():
    sp = SharePartition(0, delivery_limit=2)
    fill(sp, 3)
    sp.acknowledge("m", [(0, 2, [REJECT])], 0, LOCK)
    assert sp.dead_letters() == [] and sp.start == 3 and sp.state_of(1)[0] == ARCHIVED


def test_rejected_and_limit_archived_records_go_archiving_in_the_order_they_ended():
    sp = SharePartition(0, delivery_limit=2)
    sp.dead_letter = True
    fill(sp, 4)
    sp.acknowledge("m", [(2, 2, [REJECT]), (0, 0, [ACCEPT]), (1, 1, [RELEASE]), (3, 3, [RELEASE])], 0, LOCK)
    # 1 and 3 come back; delivered a second time (the limit) and their locks run out
    assert [a.first_offset for a in sp.acquire("m", [(1, 3, True)], 10, 10, LOCK)] == [1, 3]
    sp.expire(10 + LOCK)
    assert sp.dead_letters() == [DeadLetter(2, 0, 1, REJECTED), DeadLetter(1, 1, 2, PAST_LIMIT),
                                 DeadLetter(3, 2, 2, PAST_LIMIT)]
    assert [sp.state_of(o)[0] for o in range(4)] == [ARCHIVED, ARCHIVING, ARCHIVING, ARCHIVING]
    assert sp.start == 1   # ARCHIVING holds the start back
    assert sp.dead_lettered(1) == 2   # sequences 0 and 1: offsets 2 and 1
    assert [sp.state_of(o)[0] for o in (1, 2, 3)] == [ARCHIVED, ARCHIVED, ARCHIVING] and sp.start == 3
    assert sp.drop_dead_letters() == 1 and sp.start == 4
    assert (sp.counts.dead_lettered, sp.counts.dead_letter_failed, sp.counts.rejected,
            sp.counts.archived_by_limit) == (2, 1, 1, 2)


def test_a_reload_keeps_the_dead_letters_and_their_producer():
    sp = SharePartition(0, delivery_limit=3)
    sp.dead_letter = True
    fill(sp, 5)
    sp.acknowledge("m", [(0, 4, [REJECT, ACCEPT, REJECT, ACCEPT, ACCEPT])], 0, LOCK)
    sp.renumber(1000, 2, ("tid", 0))
    assert [d.sequence for d in sp.dead_letters()] == [0, 1]
    again = SharePartition.loaded(sp.start, sp.state_batches(), 3, dead_letters=sp.dead_letter_state(),
                                  dead_letter=True)
    assert again.dead_letter_state() == sp.dead_letter_state()
    assert [again.state_of(o)[0] for o in range(5)] == [ARCHIVING, ARCHIVED, ARCHIVING, ARCHIVED, ARCHIVED]
    assert again.start == 0 and again.end == 5
    # a record held for its last delivery when the broker stopped is archived by the limit as it
    # loads: a new dead letter, after those already owed
    again.renumber(1000, 3, ("tid", 0))
    held = SharePartition(0, delivery_limit=1)
    fill(held, 2)
    loaded = SharePartition.loaded(held.start, held.state_batches(), 1, dead_letter=True)
    assert loaded.dead_letters() == [DeadLetter(0, 0, 1, PAST_LIMIT), DeadLetter(1, 1, 1, PAST_LIMIT)]


def test_dead_letters_count_against_the_in_flight_bound_even_when_retention_took_their_records():
    sp = SharePartition(0, delivery_limit=5, max_in_flight=4)
    sp.dead_letter = True
    fill(sp, 4)
    sp.acknowledge("m", [(0, 3, [REJECT])], 0, LOCK)
    assert sp.acquire("m", [(4, 9, True)], 10, 0, LOCK) == []   # four dead letters hold the window
    sp.move_start(4)   # retention deleted 0-3: their dead letters are still owed
    assert len(sp.dead_letters()) == 4
    assert sp.acquire("m", [(4, 9, True)], 10, 0, LOCK) == []
    sp.dead_lettered(1)   # two written: two places free
    got = sp.acquire("m", [(4, 9, True)], 10, 0, LOCK)
    assert [(a.first_offset, a.last_offset) for a in got] == [(4, 5)]


def test_renumbering_starts_the_pending_dead_letters_at_zero():
    sp = SharePartition(0, delivery_limit=5)
    sp.dead_letter = True
    fill(sp, 3)
    sp.acknowledge("m", [(0, 2, [REJECT])], 0, LOCK)
    assert sp.drop_dead_letters(1) == 1
    assert [d.sequence for d in sp.dead_letters()] == [1, 2]
    sp.renumber(7, 1, ("tid", 1))
    assert [(d.offset, d.sequence) for d in sp.dead_letters()] == [(1, 0), (2, 1)]
    assert sp.dead_letter_state().next_sequence == 2
    assert sp.state_of(0)[0] == ARCHIVED and sp.state_of(3)[0] == AVAILABLE


def test_dead_letters_a_reset_forgot_still_take_their_place_in_the_bound():
    sp = SharePartition(0, delivery_limit=5, max_in_flight=4)
    sp.dead_letter = True
    fill(sp, 3)
    sp.acknowledge("m", [(0, 2, [REJECT])], 0, LOCK)
    sp.reset_to(0)   # an administrator's reset: the records are forgotten, their dead letters are not
    assert len(sp.dead_letters()) == 3
    got = sp.acquire("m", [(0, 9, True)], 10, 0, LOCK)
    assert [(a.first_offset, a.last_offset) for a in got] == [(0, 0)]   # 4 places, 3 owed
    sp.dead_lettered(2)
    assert sp.state_of(0)[0] != ARCHIVED   # the record delivered again is not the one written
