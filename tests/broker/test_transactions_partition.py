"""The partition side of transactions through a real broker process: transactional batches by raw
Produce requests, markers by WriteTxnMarkers, and read_committed readers (oncelog's consumer,
confluent-kafka's, kafka-python's) that see committed records only, never past the LSO while a
transaction is open; recovery after kill -9 with an open transaction and after an abort."""
from __future__ import annotations

import asyncio
import io
import struct
import time

import pytest
from kio.schema.types import ProducerId, TopicName
from kio.schema.write_txn_markers.v1 import request as wtm_req
from kio.schema.write_txn_markers.v1.response import WriteTxnMarkersResponse
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32
from test_dedup_raw import Client, Conn, parse_produce, produce_body, uvarint

from oncelog.client.aio.consumer import AIOConsumer
from oncelog.client.types import TopicPartition
from oncelog.protocol import entities
from oncelog.protocol import fetch as fetch_wire
from oncelog.protocol.api import ApiKey
from oncelog.protocol.entities import RequestBuilder
from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch
from oncelog.testing.broker_login import as_broker
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes


@pytest.fixture
def broker(tmp_path):
    """These tests drive the partition side alone: raw transactional Produce requests and markers
    by WriteTxnMarkers, no coordinator to verify against (Kafka's
    transaction.partition.verification.enable=false)."""
    b = BrokerProcess(tmp_path / "data", {"transaction.partition.verification.enable": "false"}).start()
    yield b
    b.stop()
NOW = 1_700_000_000_000
TID = "txn-a"
A, B, PLAIN = 5001, 5002, 5003


def batch(pid: int, seq: int, n: int = 2, transactional: bool = True, tag: bytes = b"") -> bytes:
    return encode_batch([Record(i, NOW, None, b"%s%d-%d-%d" % (tag, pid, seq, i), []) for i in range(n)],
                        producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=transactional)


def with_txn_id(body: bytes, version: int, tid: str | None) -> bytes:
    """produce_body's request with `tid` as its transactional id instead of null."""
    if tid is None:
        return body
    raw = tid.encode()
    if version >= 9:
        return uvarint(len(raw) + 1) + raw + body[1:]
    return struct.pack(">h", len(raw)) + raw + body[2:]


class Txn:
    def __init__(self, client: Client, topic: str, broker: BrokerProcess) -> None:
        self.client, self.topic = client, topic
        # markers come from a coordinator: another broker, logged in with the cluster credential
        self.coordinator = as_broker(broker.bootstrap, broker.data_dir)

    async def produce(self, records: bytes, tid: str | None = TID, version: int = 9) -> dict:
        body = with_txn_id(produce_body(version, self.topic, 0, records), version, tid)
        return parse_produce(version, await self.client.conn.raw(0, version, body, version >= 9))[0]

    async def marker(self, pid: int, commit: bool, epoch: int = 0, coordinator_epoch: int = 0,
                     transaction_version: int = 0) -> int:
        """WriteTxnMarkers v1, or v2 (KIP-1228) when `transaction_version` is given."""
        if transaction_version:
            mod = entities.module(ApiKey.WRITE_TXN_MARKERS, 2, "request")
            r = await self.coordinator.request(ApiKey.WRITE_TXN_MARKERS, 2, markers=(entities.make(
                mod.WritableTxnMarker, producer_id=pid, producer_epoch=epoch, transaction_result=commit,
                coordinator_epoch=coordinator_epoch, transaction_version=transaction_version,
                topics=(entities.make(mod.WritableTxnMarkerTopic, name=self.topic, partition_indexes=(0,)),)),))
            return r.markers[0].topics[0].partitions[0].error_code.value
        req = wtm_req.WriteTxnMarkersRequest(markers=(wtm_req.WritableTxnMarker(
            producer_id=ProducerId(pid), producer_epoch=i16(epoch), transaction_result=commit,
            topics=(wtm_req.WritableTxnMarkerTopic(name=TopicName(self.topic), partition_indexes=(i32(0),)),),
            coordinator_epoch=i32(coordinator_epoch)),))
        buf = io.BytesIO()
        entity_writer(type(req))(buf, req)
        body = await self.coordinator.raw(ApiKey.WRITE_TXN_MARKERS, 1, buf.getvalue())
        resp = entity_reader(WriteTxnMarkersResponse)(body, 0)[0]
        return resp.markers[0].topics[0].partitions[0].error_code.value

    async def fetch(self, offset: int, isolation: int) -> fetch_wire.PartitionData:
        rq = RequestBuilder(ApiKey.FETCH, 11)
        req = rq.encode(replica_id=-1, max_wait=0, min_bytes=0, max_bytes=1 << 20, isolation_level=isolation,
                        session_id=0, session_epoch=-1, topics=(rq("FetchTopic", topic=self.topic, partitions=(
                            rq("FetchPartition", partition=0, current_leader_epoch=-1, fetch_offset=offset,
                               last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20),)),),
                        forgotten_topics_data=(), rack_id="")
        body = await self.client.conn.raw(1, 11, req, False)
        return fetch_wire.decode_response(11, body).topics[0][1][0]

    async def latest(self, isolation: int) -> int:
        rq = RequestBuilder(ApiKey.LIST_OFFSETS, 5)
        req = rq.encode(replica_id=-1, isolation_level=isolation, topics=(rq(
            "ListOffsetsTopic", name=self.topic, partitions=(rq(
                "ListOffsetsPartition", partition_index=0, timestamp=-1, current_leader_epoch=-1),)),))
        from oncelog.client.aio import wire
        r = wire.decode(ApiKey.LIST_OFFSETS, 5, await self.client.conn.raw(2, 5, req, False))
        return int(r.topics[0].partitions[0].offset)


async def connect(broker, topic: str) -> Txn:
    host, port = broker.bootstrap.split(":")
    client = Client(await Conn.open(host, int(port)))
    await client.create_topic(topic)
    return Txn(client, topic, broker)


async def oncelog_read(bootstrap: str, topic: str, isolation: str, until: int) -> list[bytes]:
    """Values a consumer of oncelog reads from offset 0 until its position reaches `until`."""
    async with AIOConsumer({"auto.offset.reset": "earliest",
                            "bootstrap.servers": bootstrap, "isolation.level": isolation}) as c:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        out: list[bytes] = []
        deadline = time.monotonic() + 15
        while c.positions.get(tp) is None or c.positions[tp] < until:
            assert time.monotonic() < deadline, c.positions
            out += [r.value for r in await c.poll(200)]
        return out


def values(*specs) -> list[bytes]:
    return [b"%d-%d-%d" % (pid, seq, i) for pid, seq in specs for i in range(2)]


async def write_mixed(t: Txn) -> dict:
    """0-1 A txn | 2-3 plain | 4-5 B txn | 6-7 A txn | 8 A ABORT | 9-10 plain | 11 B COMMIT | 12-13 plain"""
    for records in (batch(A, 0), batch(PLAIN, 0, transactional=False), batch(B, 0), batch(A, 2)):
        assert (await t.produce(records))["error_code"] == 0
    assert await t.marker(A, commit=False) == 0
    assert (await t.produce(batch(PLAIN, 2, transactional=False)))["error_code"] == 0
    assert await t.marker(B, commit=True) == 0
    assert (await t.produce(batch(PLAIN, 4, transactional=False)))["error_code"] == 0
    return {"committed": values((PLAIN, 0), (B, 0), (PLAIN, 2), (PLAIN, 4)), "end": 14}


def test_lso_stops_read_committed_at_an_open_transaction(broker, unique_topic):
    async def run():
        t = await connect(broker, unique_topic)
        assert (await t.produce(batch(PLAIN, 0, transactional=False)))["error_code"] == 0
        assert (await t.produce(batch(A, 0)))["error_code"] == 0            # 2-3, open
        assert (await t.produce(batch(PLAIN, 2, transactional=False)))["error_code"] == 0
        for isolation in (0, 1):
            p = await t.fetch(0, isolation)
            assert p.high_watermark == 6 and p.last_stable_offset == 2
        committed = await t.fetch(0, 1)
        assert [h for h in _offsets(committed.records)] == [(0, 1)]
        assert committed.aborted_transactions == []
        assert (await t.fetch(0, 0)).aborted_transactions is None
        assert len(list(_offsets((await t.fetch(0, 0)).records))) == 3
        assert (await t.fetch(4, 1)).records == b""  # between LSO and HW: nothing, no error
        assert await t.latest(1) == 2 and await t.latest(0) == 6
        assert await oncelog_read(broker.bootstrap, unique_topic, "read_committed", 2) == values((PLAIN, 0))
        assert await t.marker(A, commit=True) == 0
        assert await t.latest(1) == await t.latest(0) == 7
        got = await oncelog_read(broker.bootstrap, unique_topic, "read_committed", 7)
        assert got == values((PLAIN, 0), (A, 0), (PLAIN, 2))
    asyncio.run(run())


def _offsets(records):
    from oncelog.protocol.records import iter_batches
    return ((h.base_offset, h.last_offset) for _pos, h in iter_batches(records))


def test_aborted_transactions_listed_and_filtered(broker, unique_topic):
    async def run():
        t = await connect(broker, unique_topic)
        w = await write_mixed(t)
        p = await t.fetch(0, 1)
        assert p.last_stable_offset == p.high_watermark == w["end"]
        assert p.aborted_transactions == [(A, 0)]
        assert (await t.fetch(9, 1)).aborted_transactions == []
        assert await oncelog_read(broker.bootstrap, unique_topic, "read_committed", w["end"]) == w["committed"]
        everything = await oncelog_read(broker.bootstrap, unique_topic, "read_uncommitted", w["end"])
        assert len(everything) == 12  # aborted records too, no control records
    asyncio.run(run())


def test_third_party_read_committed_consumers(broker, unique_topic):
    async def run():
        t = await connect(broker, unique_topic)
        w = await write_mixed(t)
        assert (await t.produce(batch(A, 4, tag=b"open-")))["error_code"] == 0  # open at 14
        return w
    w = asyncio.run(run())
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CTP
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-" + unique_topic,
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.assign([CTP(unique_topic, 0, 0)])
    got, deadline = [], time.monotonic() + 20
    while len(got) < len(w["committed"]) and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    extra = c.poll(1.0)  # nothing past the LSO
    c.close()
    assert got == w["committed"] and (extra is None or extra.error())

    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    k = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed",
                      enable_auto_commit=False, consumer_timeout_ms=3000)
    k.assign([KTP(unique_topic, 0)])
    k.seek(KTP(unique_topic, 0), 0)
    kgot = [m.value for m in k]
    k.close()
    assert kgot == w["committed"]


def test_transactional_produce_rules(broker, unique_topic):
    async def run():
        t = await connect(broker, unique_topic)
        r = await t.produce(batch(A, 0), tid=None)
        assert r["error_code"] == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert (await t.produce(batch(A, 0)))["error_code"] == 0
        r = await t.produce(batch(A, 2, transactional=False))
        assert r["error_code"] == E.INVALID_TXN_STATE
        assert await t.marker(A, commit=True, epoch=0, coordinator_epoch=3) == 0
        assert await t.marker(A, commit=True, epoch=0, coordinator_epoch=2) == E.TRANSACTION_COORDINATOR_FENCED
        assert await t.marker(A, commit=False, epoch=1, coordinator_epoch=3) == 0
        assert await t.marker(A, commit=False, epoch=0, coordinator_epoch=3) == E.INVALID_PRODUCER_EPOCH
        t.topic = "no-such-topic"
        assert await t.marker(A, commit=True) == E.UNKNOWN_TOPIC_OR_PARTITION
    asyncio.run(run())


@pytest.mark.parametrize("abort_first", [False, True])
def test_recovery_after_kill_9(broker, unique_topic, abort_first):
    async def before():
        t = await connect(broker, unique_topic)
        assert (await t.produce(batch(A, 0)))["error_code"] == 0        # 0-1
        assert (await t.produce(batch(B, 0)))["error_code"] == 0        # 2-3
        if abort_first:
            assert await t.marker(A, commit=False) == 0                 # 4
        assert (await t.produce(batch(PLAIN, 0, transactional=False)))["error_code"] == 0

    async def after():
        host, port = broker.bootstrap.split(":")
        t = Txn(Client(await Conn.open(host, int(port))), unique_topic, broker)
        p = await t.fetch(0, 1)
        assert p.last_stable_offset == (2 if abort_first else 0)
        assert await t.marker(B, commit=True) == 0
        if not abort_first:
            assert await t.marker(A, commit=False) == 0
        p = await t.fetch(0, 1)
        assert p.last_stable_offset == p.high_watermark
        assert p.aborted_transactions == [(A, 0)]
        got = await oncelog_read(broker.bootstrap, unique_topic, "read_committed", p.high_watermark)
        assert sorted(got) == sorted(values((B, 0), (PLAIN, 0)))

    asyncio.run(before())
    broker.restart(clean=False)
    asyncio.run(after())
