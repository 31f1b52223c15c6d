"""Produce and InitProducerId answers seen from outside (hand-built requests over a real socket to
an in-process Broker with real files): InitProducerId without a transactional id always hands out
a new id at epoch 0; every refusal for an existing partition carries its log start offset; a
transactional batch is appended as an idempotent one; ProduceResponse v14
carries ProducerStateBatchesToRetain (tag 1) on each partition and on each topic."""
from __future__ import annotations

import datetime
import struct

from kio.schema.delete_records.v2 import request as dr_req
from kio.schema.delete_records.v2.response import DeleteRecordsResponse
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.init_producer_id.v4.response import InitProducerIdResponse
from kio.schema.types import TopicName
from kio.static.primitive import i16, i32, i32Timedelta, i64
from test_dedup_raw import NOW, R, batch, broker, parse_produce, produce_body  # noqa: F401 (fixture)

from oncelog.protocol import produce as produce_codec
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.primitives import string
from oncelog.protocol.records import Record, encode_batch


async def init_producer_id(c, pid: int = -1, epoch: int = -1) -> tuple[int, int, int]:
    resp = await c.conn.kio(InitProducerIdRequest(
        transactional_id=None, transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
        producer_id=i64(pid), producer_epoch=i16(epoch)), InitProducerIdResponse)
    return resp.error_code.value, int(resp.producer_id), int(resp.producer_epoch)


async def delete_records_before(c, topic: str, offset: int) -> None:
    resp = await c.conn.kio(dr_req.DeleteRecordsRequest(
        topics=(dr_req.DeleteRecordsTopic(name=TopicName(topic), partitions=(
            dr_req.DeleteRecordsPartition(partition_index=i32(0), offset=i64(offset)),)),),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10))), DeleteRecordsResponse)
    assert resp.topics[0].partitions[0].error_code.value == 0, resp


async def produce_raw(c, topic: str, records: bytes, version: int = 14, acks: int = -1,
                      transactional_id: str | None = None) -> dict:
    target = c.topic_ids[topic] if version >= 13 else topic
    body = produce_body(version, target, 0, records, acks)
    if transactional_id is not None:  # produce_body writes a null transactional id first
        flex = version >= 9
        body = string(transactional_id, flex) + body[1 if flex else 2:]
    p, _topic_tags = parse_produce(version, await c.conn.raw(0, version, body, version >= 9))
    return p


# ------------------------------------------------------------------ item 6: InitProducerId

async def test_init_producer_id_without_transactional_id_always_answers_a_new_id_at_epoch_0(broker):
    c, _b, _ = broker
    code, first, epoch = await init_producer_id(c)
    assert (code, epoch) == (E.NONE, 0)
    # naming its own id and epoch (what a KIP-360 bump through the broker would send)
    code, second, epoch = await init_producer_id(c, first, 0)
    assert code == E.NONE and second != first and epoch == 0
    # naming an id the broker has not issued yet gets no hold on it
    unissued = max(first, second) + 100
    code, third, epoch = await init_producer_id(c, unissued, 7)
    assert code == E.NONE and third not in (first, second, unissued) and epoch == 0


# ------------------------------------------------------------------ item 6: refusals carry log start

async def test_refusals_for_an_existing_partition_carry_its_log_start_offset(broker):
    c, _b, _ = broker
    await c.create_topic("lso")
    for i in range(5):
        p = await produce_raw(c, "lso", encode_batch([Record(0, NOW, None, b"x%d" % i, [])]))
        assert p["error_code"] == 0
    await delete_records_before(c, "lso", 3)
    plain = encode_batch([Record(0, NOW, None, b"y", [])])
    for version in (5, 9, 14):
        p = await produce_raw(c, "lso", plain, version=version, acks=2)
        assert (p["error_code"], p["log_start_offset"]) == (E.INVALID_REQUIRED_ACKS, 3), (version, p)
    # errors decided by the partition carry it too
    p = await produce_raw(c, "lso", batch(5, pid=9))              # a producer never seen, not at 0
    assert (p["error_code"], p["log_start_offset"]) == (E.UNKNOWN_PRODUCER_ID, 3)
    assert (await produce_raw(c, "lso", batch(0, pid=9)))["error_code"] == 0
    p = await produce_raw(c, "lso", batch(9, pid=9))              # a gap
    assert (p["error_code"], p["log_start_offset"]) == (E.OUT_OF_ORDER_SEQUENCE_NUMBER, 3)


async def test_a_transactional_batch_needs_a_transactional_id(broker):
    c, _b, _ = broker
    await c.create_topic("txn")
    txn = encode_batch([Record(0, NOW, None, b"t", [])], producer_id=11, producer_epoch=0,
                       base_sequence=0, transactional=True)
    p = await produce_raw(c, "txn", txn, transactional_id=None)
    assert (p["error_code"], p["log_start_offset"]) == (E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, 0)
    assert p["error_message"]
    # nothing was written: the next plain record lands at offset 0
    p = await produce_raw(c, "txn", encode_batch([Record(0, NOW, None, b"p", [])]))
    assert (p["error_code"], p["base_offset"]) == (E.NONE, 0)
    # with an id no coordinator can verify (no __transaction_state yet) it is refused as Kafka's
    # AddPartitionsToTxnManager refuses it when the topic is missing: COORDINATOR_NOT_AVAILABLE
    p = await produce_raw(c, "txn", txn, transactional_id="app-1")
    assert p["error_code"] == E.COORDINATOR_NOT_AVAILABLE
    # a transactional id on a request of plain batches is ignored, as Kafka ignores it
    p = await produce_raw(c, "txn", batch(0, pid=12), transactional_id="app-1")
    assert (p["error_code"], p["base_offset"]) == (E.NONE, 1)


# ------------------------------------------------------------------ item 8: v14 tag 1 on both levels

def partition_and_topic_tags(version: int, body: bytes) -> tuple[dict, dict]:
    """The first partition's tagged fields and its topic's (v9+)."""
    r = R(body)
    r.uvarint()
    r.pos += 16 if version >= 13 else 0
    if version < 13:
        r.string(True)
    r.uvarint()
    r.take(">ihqqq")
    for _ in range(r.uvarint() - 1):
        r.take(">i")
        r.string(True)
        r.tags()
    r.string(True)
    return r.tags(), r.tags()


async def test_v14_answers_carry_batches_to_retain_on_each_partition_and_each_topic(broker):
    c, _b, _ = broker
    await c.create_topic("w5")
    await c.create_topic("w20", **{"producer.state.batches.to.retain": "20"})
    await c.create_topic("rng", **{"producer.state.dedup.mode": "range",
                                   "producer.state.batches.to.retain": "8",
                                   "max.in.flight.sequence.number.per.connection": "1000"})
    for topic, window, threshold in (("w5", 5, None), ("w20", 20, None), ("rng", 8, 1000)):
        for records, code in ((batch(0, pid=21), E.NONE), (batch(7, pid=21), E.OUT_OF_ORDER_SEQUENCE_NUMBER)):
            body = await c.conn.raw(0, 14, produce_body(14, c.topic_ids[topic], 0, records), True)
            part_tags, topic_tags = partition_and_topic_tags(14, body)
            assert struct.unpack(">i", part_tags[1])[0] == window, (topic, part_tags)
            assert struct.unpack(">i", topic_tags[1])[0] == window
            # range mode: tag 1 stays the batch limit; the sequence threshold is the topic's tag 10000
            assert 10000 not in part_tags
            assert (struct.unpack(">i", topic_tags[10000])[0] if 10000 in topic_tags else None) == threshold
            # and oncelog's client reads what the broker wrote
            [t] = produce_codec.decode_response(14, body)
            p = t.partitions[0]
            assert p.error_code == code
            assert (p.batches_to_retain, p.topic_batches_to_retain, p.reported_batches_to_retain) == (window,) * 3
            assert t.max_in_flight_sequence_number == threshold
    # before v14 neither level has it
    body = await c.conn.raw(0, 13, produce_body(13, c.topic_ids["w20"], 0, batch(20, pid=22)), True)
    assert partition_and_topic_tags(13, body) == ({}, {})
    # a partition that does not exist gets no window
    body = await c.conn.raw(0, 14, produce_body(14, c.topic_ids["w20"], 3, batch(0, pid=23)), True)
    part_tags, topic_tags = partition_and_topic_tags(14, body)
    assert 1 not in part_tags and 1 not in topic_tags


async def test_the_producer_learns_the_window_from_a_real_broker(broker):
    from oncelog.client.aio.producer import AIOProducer
    _c, b, _ = broker
    await _c.create_topic("learn", **{"producer.state.batches.to.retain": "20"})
    p = AIOProducer({"bootstrap.servers": f"{b.host}:{b.port}", "enable.idempotence": "required",
                     "linger.ms": 0})
    await p.start()
    try:
        for i in range(3):
            await (await p.send("learn", b"v%d" % i))
        ps = p.core.partitions[next(tp for tp in p.core.partitions if tp.topic == "learn")]
        assert ps.window == 20
    finally:
        await p.close()


# ------------------------------------------------------------------ read_committed (kafkajs's default)

async def test_read_committed_fetch_and_list_offsets_see_everything_without_transactions(broker):
    """kafkajs and librdkafka consumers read read_committed by default: with no transactions the
    last stable offset is the high watermark, and nothing is aborted."""
    from oncelog.protocol import entities
    c, _b, _ = broker
    await c.create_topic("rc")
    for i in range(3):
        assert (await produce_raw(c, "rc", batch(i * 2, pid=31)))["error_code"] == 0
    fp = entities.nested(1, 11, "request", "FetchPartition")
    ft = entities.nested(1, 11, "request", "FetchTopic")
    req = entities.make(entities.entity_class(1, 11, "request"), max_wait=100, min_bytes=1,
                        isolation_level=1, topics=(ft(topic="rc", partitions=(
                            fp(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
                        forgotten_topics_data=())
    resp = await c.conn.kio(req, entities.entity_class(1, 11, "response"))
    p = resp.responses[0].partitions[0]
    assert (p.error_code.value, int(p.high_watermark), int(p.last_stable_offset)) == (0, 6, 6)
    assert not p.aborted_transactions and p.records
    lp = entities.nested(2, 5, "request", "ListOffsetsPartition")
    lt = entities.nested(2, 5, "request", "ListOffsetsTopic")
    req = entities.make(entities.entity_class(2, 5, "request"), replica_id=-1, isolation_level=1,
                        topics=(lt(name="rc", partitions=(lp(partition_index=0, timestamp=-1),)),))
    resp = await c.conn.kio(req, entities.entity_class(2, 5, "response"))
    assert int(resp.topics[0].partitions[0].offset) == 6
