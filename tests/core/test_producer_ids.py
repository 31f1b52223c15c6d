"""KIP-730's producer-id blocks as the controller decides and replays them (core/controller_state.py),
mirroring Kafka's ProducerIdControlManagerTest."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncelog.core.controller_state import BLOCK_SIZE, ControllerState, ProducerIdsBlock
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError


def registered(*brokers):
    s = ControllerState()
    for b in brokers:
        records, _epoch = s.decide_register(b, "h", 1)
        for r in records:
            s.replay(r)
    return s


def allocate(s, broker, epoch):
    records, block = s.decide_allocate(broker, epoch)
    for r in records:
        s.replay(r)
    return block


def test_initial_result_is_block_zero_and_record_carries_the_next_id():
    s = registered(1)
    records, block = s.decide_allocate(1, 1)
    assert block == ProducerIdsBlock(1, 0, 1000)
    assert records[0]["next_producer_id"] == 1000
    assert s.next_producer_id == 0  # a decision changes nothing


def test_monotonic_replay_refuses_going_back_but_allows_gaps():
    s = registered(1)
    s.replay({"type": "pid_block", "broker_id": 1, "broker_epoch": 1, "next_producer_id": 5000})
    with pytest.raises(ValueError):
        s.replay({"type": "pid_block", "broker_id": 1, "broker_epoch": 1, "next_producer_id": 5000})
    with pytest.raises(ValueError):
        s.replay({"type": "pid_block", "broker_id": 1, "broker_epoch": 1, "next_producer_id": 1000})
    assert allocate(s, 1, 1).first == 5000


def test_unknown_broker_or_stale_epoch():
    s = registered(1)
    with pytest.raises(KafkaProtocolError) as e:
        s.decide_allocate(2, 1)
    assert e.value.code == ErrorCode.BROKER_ID_NOT_REGISTERED
    with pytest.raises(KafkaProtocolError) as e:
        s.decide_allocate(1, 7)
    assert e.value.code == ErrorCode.STALE_BROKER_EPOCH


def test_max_value():
    s = registered(1)
    s.replay({"type": "pid_block", "broker_id": 1, "broker_epoch": 1, "next_producer_id": 2**63 - 10})
    with pytest.raises(KafkaProtocolError) as e:
        s.decide_allocate(1, 1)
    assert e.value.code == ErrorCode.UNKNOWN_SERVER_ERROR


def test_generate_producer_ids_100_calls():
    s = registered(3)
    for _ in range(100):
        allocate(s, 3, 1)
    assert allocate(s, 3, 1) == ProducerIdsBlock(3, 100_000, BLOCK_SIZE)


def test_upgrade_floor_continues_above_earlier_ids():
    s = registered(1)
    for r in s.decide_floor(4321):
        s.replay(r)
    assert allocate(s, 1, 1).first == 4321
    assert s.decide_floor(10) == []


@given(st.lists(st.integers(1, 3), min_size=1, max_size=60))
def test_blocks_never_overlap_whoever_asks(brokers):
    s = registered(1, 2, 3)
    epochs = {b.broker_id: b.epoch for b in s.brokers.values()}
    blocks = [allocate(s, b, epochs[b]) for b in brokers]
    for a, b in zip(blocks, blocks[1:]):
        assert b.first == a.next_first
