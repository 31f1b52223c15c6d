"""Leadership decisions: balanced placement, moves and failures bump the leader epoch, replay is
the only state change and refuses an epoch that does not increase."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.core.leadership import Leadership
from oncelog.protocol.errors import KafkaProtocolError


def apply(state, records):
    for r in records:
        state.replay(r)
    return records


def test_new_topic_spreads_leaders_over_live_brokers():
    s = Leadership()
    apply(s, s.decide_create_topic("t", "id", 6, {}, live=[1, 2, 3]))
    leaders = [s.leaders[("t", p)][0] for p in range(6)]
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]
    assert all(s.leaders[("t", p)][1] == 0 for p in range(6))


def test_decisions_do_not_change_state():
    s = Leadership()
    s.decide_create_topic("t", "id", 2, {}, live=[1])
    assert s.topics == {} and s.leaders == {}


def test_move_bumps_the_epoch_and_refuses_dead_brokers():
    s = Leadership()
    apply(s, s.decide_create_topic("t", "id", 1, {}, live=[1, 2]))
    leader, epoch = s.leaders[("t", 0)]
    other = 2 if leader == 1 else 1
    apply(s, s.decide_move("t", 0, other, live=[1, 2]))
    assert s.leaders[("t", 0)] == (other, epoch + 1)
    assert s.decide_move("t", 0, other, live=[1, 2]) == []
    with pytest.raises(KafkaProtocolError):
        s.decide_move("t", 0, 3, live=[1, 2])


def test_dead_leader_is_replaced_with_a_new_epoch():
    s = Leadership()
    apply(s, s.decide_create_topic("t", "id", 4, {}, live=[1, 2]))
    apply(s, s.decide_brokers_changed(live=[2]))
    assert all(s.leaders[("t", p)][0] == 2 for p in range(4))
    assert {s.leaders[("t", p)][1] for p in range(4)} <= {0, 1}
    assert s.decide_brokers_changed(live=[2]) == []


def test_replay_refuses_an_epoch_that_does_not_increase():
    s = Leadership()
    apply(s, s.decide_create_topic("t", "id", 1, {}, live=[1]))
    with pytest.raises(ValueError):
        s.replay({"type": "leader", "topic": "t", "partition": 0, "leader": 1, "epoch": 0})


@given(st.lists(st.tuples(st.sampled_from(["move", "die", "revive"]), st.integers(1, 3)), max_size=30))
def test_epochs_only_increase_and_leaders_are_live(ops):
    s = Leadership()
    live = [1, 2, 3]
    apply(s, s.decide_create_topic("t", "id", 3, {}, live=live))
    seen = {k: v[1] for k, v in s.leaders.items()}
    for op, b in ops:
        if op == "die" and b in live and len(live) > 1:
            live.remove(b)
            apply(s, s.decide_brokers_changed(live))
        elif op == "revive" and b not in live:
            live.append(b)
        elif op == "move":
            if b in live:
                apply(s, s.decide_move("t", b % 3, b, live))
        for k, (leader, epoch) in s.leaders.items():
            assert leader in live
            assert epoch >= seen[k]
            seen[k] = epoch


def test_new_partitions_get_leaders_and_replay_grows_the_topic():
    from oncelog.core.leadership import PARTITIONS
    from oncelog.protocol.errors import ErrorCode
    s = Leadership()
    apply(s, s.decide_create_topic("t", "id", 2, {}, live=[1, 2]))
    records = s.decide_create_partitions("t", 6, None, live=[1, 2, 3])
    assert s.topics["t"].partitions == 2  # deciding changes nothing
    apply(s, records)
    assert s.topics["t"].partitions == 6
    assert sorted(s.leaders[("t", p)][0] for p in range(6)) == [1, 1, 2, 2, 3, 3]
    apply(s, s.decide_create_partitions("t", 7, [[2]], live=[1, 2, 3]))
    assert s.leaders[("t", 6)] == (2, 0)
    for count, assignments, code in [(7, None, ErrorCode.INVALID_PARTITIONS), (3, None, ErrorCode.INVALID_PARTITIONS),
                                     (8, [[1, 2]], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
                                     (8, [[9]], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
                                     (9, [[1]], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
                                     (8, [[]], ErrorCode.INVALID_REPLICA_ASSIGNMENT)]:
        with pytest.raises(KafkaProtocolError) as e:
            s.decide_create_partitions("t", count, assignments, live=[1, 2, 3])
        assert e.value.code == code
    with pytest.raises(KafkaProtocolError) as e:
        s.decide_create_partitions("nope", 3, None, live=[1])
    assert e.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(ValueError):  # a count that does not grow never replays
        s.replay({"type": PARTITIONS, "name": "t", "partitions": 7})
