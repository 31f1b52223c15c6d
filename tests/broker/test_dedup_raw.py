"""Deduplication rules seen from outside: hand-built Produce requests (v3, v9, v14) over a real
socket to an in-process Broker with real files. Each test shows one rule of DESIGN.md's "Broker
rules", including ProduceResponse v14's TopicProduceResponse tags 1 (ProducerStateBatchesToRetain)
and 10000 (MaxInFlightSequenceNumber, range mode only)."""
from __future__ import annotations

import datetime
import io
import struct
import uuid

import pytest
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.create_topics.v7.response import CreateTopicsResponse
from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest
from kio.schema.describe_producers.v0.response import DescribeProducersResponse
from kio.schema.incremental_alter_configs.v1 import request as iac_req
from kio.schema.incremental_alter_configs.v1.response import IncrementalAlterConfigsResponse
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.init_producer_id.v4.response import InitProducerIdResponse
from kio.schema.metadata.v12 import request as md_req
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from oncelog.broker.config import BrokerConfig
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.testing.in_process import InProcessBroker
from oncelog.testing.raw_client import AsyncRawConnection

NOW = 1_700_000_000_000


# ------------------------------------------------------------------ wire helpers

def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class R:
    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def take(self, fmt: str):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            b = self.buf[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7

    def string(self, compact: bool) -> str | None:
        n = self.uvarint() - 1 if compact else self.take(">h")
        if n < 0:
            return None
        s = self.buf[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def tags(self) -> dict[int, bytes]:
        out = {}
        for _ in range(self.uvarint()):
            tag, size = self.uvarint(), self.uvarint()
            out[tag] = self.buf[self.pos:self.pos + size]
            self.pos += size
        return out


class Conn(AsyncRawConnection):
    """The raw wire client (`testing.raw_client`) on this test's event loop, which the broker shares."""

    async def raw(self, api_key: int, version: int, body: bytes, flexible: bool | None = None) -> bytes:
        """The response body (`flexible`: the header's form, which the API and version decide)."""
        return await self.exchange(api_key, version, body)

    async def kio(self, request, response_type):
        buf = io.BytesIO()
        entity_writer(type(request))(buf, request)
        body = await self.raw(int(request.__api_key__), int(request.__version__), buf.getvalue())
        return entity_reader(response_type)(body, 0)[0]


def produce_body(version: int, topic: str | uuid.UUID, partition: int, records: bytes, acks: int = -1,
                 timeout_ms: int = 30000) -> bytes:
    flexible = version >= 9
    if not flexible:
        name = topic.encode()
        return (struct.pack(">hhi", -1, acks, timeout_ms) + struct.pack(">i", 1) + struct.pack(">h", len(name)) + name
                + struct.pack(">i", 1) + struct.pack(">ii", partition, len(records)) + records)
    out = [b"\x00", struct.pack(">hi", acks, timeout_ms), uvarint(2)]
    if version >= 13:
        out.append(topic.bytes)
    else:
        name = topic.encode()
        out.append(uvarint(len(name) + 1) + name)
    out += [uvarint(2), struct.pack(">i", partition), uvarint(len(records) + 1), records, b"\x00", b"\x00", b"\x00"]
    return b"".join(out)


def parse_produce(version: int, body: bytes) -> tuple[dict, dict[int, bytes]]:
    """The single partition answer and its topic's tagged fields."""
    flexible = version >= 9
    r = R(body)
    n = r.uvarint() - 1 if flexible else r.take(">i")
    assert n == 1
    if version >= 13:
        r.pos += 16
    else:
        r.string(flexible)
    m = r.uvarint() - 1 if flexible else r.take(">i")
    assert m == 1
    p = {"index": r.take(">i"), "error_code": r.take(">h"), "base_offset": r.take(">q")}
    p["log_append_time"] = r.take(">q") if version >= 2 else -1
    p["log_start_offset"] = r.take(">q") if version >= 5 else None
    if version >= 8:
        errs = r.uvarint() - 1 if flexible else r.take(">i")
        for _ in range(errs):
            r.take(">i")
            r.string(flexible)
            if flexible:
                r.tags()
        p["error_message"] = r.string(flexible)
    if flexible:
        r.tags()
        return p, r.tags()
    return p, {}


def batch(seq: int, n: int = 2, pid: int = 7, epoch: int = 0) -> bytes:
    return encode_batch([Record(i, NOW, None, b"r%d-%d" % (seq, i), []) for i in range(n)],
                        producer_id=pid, producer_epoch=epoch, base_sequence=seq)


# ------------------------------------------------------------------ broker fixture

class Client:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.topic_ids: dict[str, uuid.UUID] = {}

    async def create_topic(self, name: str, **configs: str) -> None:
        req = ct_req.CreateTopicsRequest(topics=(ct_req.CreatableTopic(
            name=TopicName(name), num_partitions=i32(1), replication_factor=i16(1), assignments=(),
            configs=tuple(ct_req.CreatableTopicConfig(name=k, value=str(v)) for k, v in configs.items())),),
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)), validate_only=False)
        resp = await self.conn.kio(req, CreateTopicsResponse)
        assert resp.topics[0].error_code.value == 0, resp
        # kio refuses unknown tags such as our MessageFormatVersion (10000); the client's reader skips them
        from oncelog.protocol import metadata as metadata_codec
        body = await self.conn.raw(3, 12, metadata_codec.encode_request(12, [name]), True)
        self.topic_ids[name] = metadata_codec.decode_response(12, body).topics[name].topic_id

    async def produce(self, topic: str, records: bytes, version: int = 14):
        target = self.topic_ids[topic] if version >= 13 else topic
        body = await self.conn.raw(0, version, produce_body(version, target, 0, records), version >= 9)
        return parse_produce(version, body)

    async def init_producer_id(self, pid: int = -1, epoch: int = -1) -> tuple[int, int]:
        resp = await self.conn.kio(InitProducerIdRequest(
            transactional_id=None, transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
            producer_id=i64(pid), producer_epoch=i16(epoch)), InitProducerIdResponse)
        assert resp.error_code.value == 0, resp
        return int(resp.producer_id), int(resp.producer_epoch)

    async def alter(self, topic: str, **configs) -> None:
        req = iac_req.IncrementalAlterConfigsRequest(resources=(iac_req.AlterConfigsResource(
            resource_type=i8(2), resource_name=topic,
            configs=tuple(iac_req.AlterableConfig(name=k.replace("_", "."), config_operation=i8(0), value=str(v))
                          for k, v in configs.items())),), validate_only=False)
        resp = await self.conn.kio(req, IncrementalAlterConfigsResponse)
        assert resp.responses[0].error_code.value == 0, resp


async def start_broker(tmp_path):
    broker = InProcessBroker(_broker_config(tmp_path))
    host, port = (await broker.start())[:2]
    return broker, host, port


def _broker_config(tmp_path):
    return BrokerConfig({"log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0",
                         "node.id": "1"})


@pytest.fixture
async def broker(tmp_path):
    b, host, port = await start_broker(tmp_path)
    conn = await Conn.open(host, port)
    yield Client(conn), b, tmp_path
    await conn.close()
    await b.stop()


async def fill(c: Client, topic: str, n: int, size: int = 2, pid: int = 7, epoch: int = 0, start: int = 0):
    offsets = []
    for i in range(n):
        p, _tags = await c.produce(topic, batch(start + i * size, size, pid, epoch))
        assert p["error_code"] == 0, p
        offsets.append(p["base_offset"])
    return offsets


async def end_offset(c: Client, topic: str) -> int:
    """The next offset, learned by appending one plain record (then it is part of the log)."""
    p, _ = await c.produce(topic, encode_batch([Record(0, NOW, None, b"probe", [])]))
    return p["base_offset"]


# ------------------------------------------------------------------ the rules

async def test_v14_topic_field_tells_window_and_range_threshold(broker):
    c, _b, _ = broker
    await c.create_topic("w5")
    await c.create_topic("w20", **{"producer.state.batches.to.retain": "20"})
    await c.create_topic("rng", **{"producer.state.dedup.mode": "range",
                                   "max.in.flight.sequence.number.per.connection": "1000"})
    for topic, window, threshold in (("w5", 5, None), ("w20", 20, None), ("rng", 5, 1000)):
        p, tags = await c.produce(topic, batch(0))
        assert p["error_code"] == 0
        assert struct.unpack(">i", tags[1])[0] == window
        if threshold is None:
            assert 10000 not in tags
        else:
            assert struct.unpack(">i", tags[10000])[0] == threshold
    _p, tags = await c.produce("w20", batch(2), version=12)
    assert tags == {}  # no tags before v14


async def test_duplicate_of_latest_answers_original_offset_and_appends_nothing(broker):
    c, _b, _ = broker
    await c.create_topic("dup")
    pid, epoch = await c.init_producer_id()
    offsets = await fill(c, "dup", 3, pid=pid, epoch=epoch)
    for version in (3, 9, 14):
        p, _ = await c.produce("dup", batch(4, pid=pid, epoch=epoch), version=version)
        assert (p["error_code"], p["base_offset"]) == (0, offsets[2])
    assert await end_offset(c, "dup") == offsets[2] + 2


async def test_duplicate_15_back_window_20_vs_window_5(broker):
    c, _b, _ = broker
    await c.create_topic("w20", **{"producer.state.batches.to.retain": "20"})
    await c.create_topic("w5")
    o20 = await fill(c, "w20", 30)
    await fill(c, "w5", 30)
    p, _ = await c.produce("w20", batch(14 * 2))
    assert (p["error_code"], p["base_offset"]) == (0, o20[14])
    p, _ = await c.produce("w5", batch(14 * 2))
    assert p["error_code"] == E.OUT_OF_ORDER_SEQUENCE_NUMBER and p["log_start_offset"] == 0
    assert p["error_message"]
    assert await end_offset(c, "w5") == 60


async def test_range_mode_duplicate_sequence_and_out_of_order(broker):
    c, _b, _ = broker
    await c.create_topic("rng", **{"producer.state.dedup.mode": "range",
                                   "max.in.flight.sequence.number.per.connection": "20"})
    offsets = await fill(c, "rng", 10)  # sequences 0..19
    p, _ = await c.produce("rng", batch(18))
    assert (p["error_code"], p["base_offset"]) == (0, offsets[-1])
    p, _ = await c.produce("rng", batch(4))
    assert p["error_code"] == E.DUPLICATE_SEQUENCE_NUMBER and p["log_start_offset"] == 0
    p, _ = await c.produce("rng", batch(0))  # 19 below 19: still in range
    assert p["error_code"] == E.DUPLICATE_SEQUENCE_NUMBER
    p, _ = await c.produce("rng", batch(30))
    assert p["error_code"] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert await end_offset(c, "rng") == 20


async def test_epochs_and_unknown_producer(broker):
    c, _b, _ = broker
    await c.create_topic("ep")
    pid, epoch = await c.init_producer_id()
    await fill(c, "ep", 2, pid=pid, epoch=epoch + 1)
    p, _ = await c.produce("ep", batch(4, pid=pid, epoch=epoch))
    assert p["error_code"] == E.INVALID_PRODUCER_EPOCH and p["log_start_offset"] == 0
    p, _ = await c.produce("ep", batch(4, pid=pid, epoch=epoch + 2))
    assert p["error_code"] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    p, _ = await c.produce("ep", batch(0, pid=pid, epoch=epoch + 2))
    assert p["error_code"] == 0
    p, _ = await c.produce("ep", batch(8, pid=pid + 1000))  # never seen, sequence not 0
    assert p["error_code"] == E.UNKNOWN_PRODUCER_ID and p["log_start_offset"] == 0


async def test_old_message_format_refuses_idempotence(broker):
    c, _b, _ = broker
    await c.create_topic("old", **{"message.format.version": "0.10.2"})
    p, _ = await c.produce("old", batch(0))
    assert p["error_code"] == E.UNSUPPORTED_FOR_MESSAGE_FORMAT and p["log_start_offset"] == 0
    p, _ = await c.produce("old", encode_batch([Record(0, NOW, None, b"plain", [])]))
    assert p["error_code"] == 0


async def test_window_change_at_runtime_applies_to_next_batches(broker):
    c, _b, _ = broker
    await c.create_topic("alt")
    await fill(c, "alt", 3)
    await c.alter("alt", **{"producer.state.batches.to.retain": "20"})
    offsets = await fill(c, "alt", 25, start=6)
    _p, tags = await c.produce("alt", batch(6 + 25 * 2))
    assert struct.unpack(">i", tags[1])[0] == 20
    p, _ = await c.produce("alt", batch(6 + 10 * 2))  # 16 batches back
    assert (p["error_code"], p["base_offset"]) == (0, offsets[10])


async def test_describe_producers(broker):
    c, _b, _ = broker
    await c.create_topic("dp")
    pid, epoch = await c.init_producer_id()
    await fill(c, "dp", 3, pid=pid, epoch=epoch)
    resp = await c.conn.kio(DescribeProducersRequest(topics=(TopicRequest(name=TopicName("dp"),
                                                                          partition_indexes=(i32(0),)),)),
                            DescribeProducersResponse)
    part = resp.topics[0].partitions[0]
    assert part.error_code.value == 0
    assert [(s.producer_id, s.producer_epoch, s.last_sequence) for s in part.active_producers] == [(pid, epoch, 5)]


async def test_full_window_deduplicates_after_restart(tmp_path):
    b, host, port = await start_broker(tmp_path)
    c = Client(await Conn.open(host, port))
    try:
        await c.create_topic("rs", **{"producer.state.batches.to.retain": "20"})
        offsets = await fill(c, "rs", 25)
    finally:
        await c.conn.close()
        await b.stop()
    b, host, port = await start_broker(tmp_path)
    c = Client(await Conn.open(host, port))
    try:
        md = await c.conn.kio(md_req.MetadataRequest(
            topics=(md_req.MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=TopicName("rs")),),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False), MetadataResponse)
        c.topic_ids["rs"] = md.topics[0].topic_id
        for i in range(5, 25):
            p, _ = await c.produce("rs", batch(i * 2))
            assert (p["error_code"], p["base_offset"]) == (0, offsets[i]), i
        assert await end_offset(c, "rs") == 50
    finally:
        await c.conn.close()
        await b.stop()
