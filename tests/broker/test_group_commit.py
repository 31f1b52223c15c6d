"""Group commit over a real Partition and real files, with the fsync held open so that appends
arrive while it runs: one fsync covers them all, nothing is durable (or visible) before its
fsync returns, and after a failed fsync every record it and its successors held is cut, their
waiters are told so, and producer state agrees with what is left."""
from __future__ import annotations

import asyncio
import struct
import threading

import pytest

from oncelog.broker.logs.fsync_batcher import GroupCommit
from oncelog.core.producer_state import ProducerStateConfig
from oncelog.protocol.records import Record, decode_records, encode_batch
from oncelog.storage import failpoints as fp
from oncelog.storage.log import LogConfig, PartitionLog
from oncelog.storage.partition import Partition

NOW = 1_700_000_000_000
PID = 7

pytestmark = pytest.mark.timeout(60)


def batch(seq: int, n: int = 2) -> bytearray:
    return bytearray(encode_batch([Record(i, NOW, None, b"s%d" % (seq + i), []) for i in range(n)],
                                  producer_id=PID, producer_epoch=0, base_sequence=seq))


class HeldFsync:
    """Partition.run_sync that waits for `release()` before fsyncing (or failing)."""

    def __init__(self, partition: Partition) -> None:
        self.real = partition.run_sync
        self.started = threading.Semaphore(0)
        self.go = threading.Semaphore(0)
        self.fail = []
        self.calls = 0
        partition.run_sync = self

    def __call__(self, token) -> None:
        self.calls += 1
        self.started.release()
        self.go.acquire()
        if self.fail and self.fail.pop(0):
            fp.configure("fsync-eio:log")
            try:
                self.real(token)
            finally:
                fp.configure(None)
        else:
            self.real(token)

    async def wait_started(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.started.acquire)

    def release(self, fail: bool = False) -> None:
        self.fail.append(fail)
        self.go.release()


@pytest.fixture
def partition(tmp_path):
    p = Partition("t", 0, PartitionLog.open(tmp_path / "t-0", LogConfig(), NOW), ProducerStateConfig(), now_ms=NOW)
    yield p
    p.close()


def append(p: Partition, seq: int, n: int = 2):
    r = p.append_from_client(batch(seq, n), NOW)
    assert r.error_code == 0, r
    return r


def visible(p: Partition) -> list[int]:
    return [r.offset for r in decode_records(p.read(0, 1 << 20))]


async def test_one_fsync_covers_the_appends_that_arrived_while_the_last_ran(partition):
    gc = GroupCommit(lambda: NOW)
    held = HeldFsync(partition)
    try:
        a = gc.durable(partition, append(partition, 0).last_offset + 1)
        await held.wait_started()                  # fsync 1 (covers a) runs
        b = gc.durable(partition, append(partition, 2).last_offset + 1)
        c = gc.durable(partition, append(partition, 4).last_offset + 1)
        assert visible(partition) == [] and not a.done()
        held.release()
        assert await a is True
        assert not b.done() and visible(partition) == [0, 1]   # b, c wait for the next fsync
        await held.wait_started()                  # fsync 2 covers b and c together
        held.release()
        assert await b is True and await c is True
        assert held.calls == 2 and gc.fsyncs == 2
        assert visible(partition) == [0, 1, 2, 3, 4, 5]
        assert gc.durable(partition, 6) is None    # nothing to wait for
    finally:
        gc.close()


async def test_a_failed_fsync_cuts_its_group_and_what_came_after(partition):
    gc = GroupCommit(lambda: NOW)
    held = HeldFsync(partition)
    try:
        first = gc.durable(partition, append(partition, 0).last_offset + 1)
        await held.wait_started()
        held.release()
        assert await first is True                 # offsets 0..1 are durable
        a = gc.durable(partition, append(partition, 2).last_offset + 1)
        await held.wait_started()                  # this fsync will fail
        b = gc.durable(partition, append(partition, 4).last_offset + 1)   # arrives meanwhile
        held.release(fail=True)
        assert await a is False and await b is False
        assert partition.log_end_offset == 2 and visible(partition) == [0, 1]
        assert not partition.offline
        # producer state forgot both: their retries are appended, once, at the same offsets
        for seq, offset in ((2, 2), (4, 4)):
            r = partition.append_from_client(batch(seq), NOW)
            assert (r.error_code, r.base_offset, r.extra.get("duplicate")) == (0, offset, None)
        again = gc.durable(partition, partition.log_end_offset)
        await held.wait_started()
        held.release()
        assert await again is True
        assert visible(partition) == [0, 1, 2, 3, 4, 5]
        r = partition.append_from_client(batch(4), NOW)
        assert (r.base_offset, r.extra.get("duplicate")) == (4, "latest")
    finally:
        gc.close()


async def test_a_duplicate_is_answered_only_once_its_original_is_durable(partition):
    gc = GroupCommit(lambda: NOW)
    held = HeldFsync(partition)
    try:
        r = append(partition, 0)
        original = gc.durable(partition, r.last_offset + 1)
        await held.wait_started()
        dup = partition.append_from_client(batch(0), NOW)     # a retry while the fsync runs
        assert (dup.base_offset, dup.last_offset, dup.extra.get("duplicate")) == (0, 1, "latest")
        retry = gc.durable(partition, dup.last_offset + 1)
        assert retry is not None and not retry.done()
        held.release(fail=True)
        assert await original is False and await retry is False   # neither may claim success
        assert partition.append_from_client(batch(0), NOW).extra.get("duplicate") is None
    finally:
        gc.close()


# ---------------------------------------------------------------- through the broker's connection

def send_produce(writer, topic: str, seq: int, correlation_id: int, timeout_ms: int = 30_000) -> None:
    """An acks=all Produce v9 of `batch(seq)`, written without waiting for its answer."""
    from test_dedup_raw import produce_body

    body = produce_body(9, topic, 0, bytes(batch(seq)), acks=-1, timeout_ms=timeout_ms)
    header = struct.pack(">hhih", 0, 9, correlation_id, 4) + b"test" + b"\x00"
    writer.write(struct.pack(">i", len(header) + len(body)) + header + body)


def send_metadata(writer, correlation_id: int) -> None:
    """A Metadata v1 of every topic: a request that must wait for every answer before it."""
    metadata = struct.pack(">hhih", 3, 1, correlation_id, 4) + b"test" + struct.pack(">i", -1)
    writer.write(struct.pack(">i", len(metadata)) + metadata)


def hold_fsyncs(monkeypatch) -> tuple[threading.Semaphore, list[int]]:
    """Every Partition's fsync waits for a release of the semaphore returned; the list gets
    the end offset each fsync covers, as it starts."""
    real = Partition.run_sync
    gate = threading.Semaphore(0)
    calls: list[int] = []

    def held(self, token):
        calls.append(token.end_offset)
        gate.acquire()
        real(self, token)
    monkeypatch.setattr(Partition, "run_sync", held)
    return gate, calls


async def read_answer(reader) -> tuple[int, bytes]:
    """(correlation id, the answer's bytes from the correlation id on), within 10 s."""
    async def read() -> tuple[int, bytes]:
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        data = await reader.readexactly(size)
        return struct.unpack(">i", data[:4])[0], data
    return await asyncio.wait_for(read(), 10)


async def test_pipelined_produce_requests_share_an_fsync_and_are_answered_in_order(tmp_path, monkeypatch):
    """Three Produce requests sent back to back on one connection: all three are appended while
    the first fsync runs, the second fsync covers the other two, and the answers come in order."""
    from test_dedup_raw import Client, Conn, parse_produce, start_broker

    broker, host, port = await start_broker(tmp_path)
    c = Client(await Conn.open(host, port))
    gate = threading.Semaphore(0)
    try:
        await c.create_topic("p")
        gate, calls = hold_fsyncs(monkeypatch)
        for i, seq in enumerate((0, 2, 4)):
            send_produce(c.conn.writer, "p", seq, 100 + i)
        await c.conn.writer.drain()
        deadline = asyncio.get_running_loop().time() + 10
        partition = broker.logs.get_partition("p", 0)
        while (partition.log_end_offset < 6 or not calls) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert partition.log_end_offset == 6 and calls == [2]   # all appended during fsync 1
        gate.release()
        gate.release()
        answers = []
        for _ in range(3):
            cid, data = await read_answer(c.conn.reader)
            answers.append((cid, parse_produce(9, data[5:])[0]["base_offset"]))
        assert answers == [(100, 0), (101, 2), (102, 4)]
        assert calls == [2, 6]                                   # one fsync for the last two
    finally:
        for _ in range(4):
            gate.release()
        await c.conn.close()
        await broker.stop()


async def test_a_lone_acks_all_produce_is_answered_after_exactly_one_fsync(tmp_path):
    """Nothing else in flight: the request's fsync starts at once (no group-commit tick to wait
    for), its answer goes out after that fsync and no other (the log's fsync counter)."""
    from test_dedup_raw import Client, Conn, start_broker

    broker, host, port = await start_broker(tmp_path)
    c = Client(await Conn.open(host, port))
    try:
        await c.create_topic("lone")
        partition = broker.logs.get_partition("lone", 0)
        for seq in (0, 2, 4):
            before = partition.fsyncs
            p, _tags = await c.produce("lone", bytes(batch(seq)))
            assert p["error_code"] == 0 and p["base_offset"] == seq
            assert partition.fsyncs == before + 1 and partition.durable_end_offset == seq + 2
    finally:
        await c.conn.close()
        await broker.stop()


async def test_an_fsync_slower_than_the_request_timeout_is_answered_request_timed_out_in_order(tmp_path, monkeypatch):
    """The fsync held past the first request's timeout (200 ms): it is answered
    REQUEST_TIMED_OUT while the fsync still runs, and the two requests behind it (a Produce with
    a long timeout, appended meanwhile, and a Metadata, which waits for every answer before it)
    are answered after it, in order, once the fsync returns; the Produce's batch is then kept."""
    from test_dedup_raw import Client, Conn, parse_produce, start_broker

    broker, host, port = await start_broker(tmp_path)
    c = Client(await Conn.open(host, port))
    gate = threading.Semaphore(0)
    try:
        await c.create_topic("slow")
        gate, _calls = hold_fsyncs(monkeypatch)
        send_produce(c.conn.writer, "slow", 0, 200, timeout_ms=200)
        send_produce(c.conn.writer, "slow", 2, 201)
        send_metadata(c.conn.writer, 202)
        await c.conn.writer.drain()
        cid, data = await read_answer(c.conn.reader)   # while the fsync is still held
        first = parse_produce(9, data[5:])[0]
        assert cid == 200 and first["error_code"] == 7 and first["base_offset"] == -1   # REQUEST_TIMED_OUT
        gate.release()
        gate.release()
        cid, data = await read_answer(c.conn.reader)
        assert cid == 201 and parse_produce(9, data[5:])[0]["error_code"] == 0
        cid, _data = await read_answer(c.conn.reader)
        assert cid == 202
        partition = broker.logs.get_partition("slow", 0)
        assert partition.durable_end_offset == 4
    finally:
        for _ in range(4):
            gate.release()
        await c.conn.close()
        await broker.stop()


@pytest.mark.handler_bug
async def test_an_answer_that_cannot_be_made_after_its_fsync_is_a_handler_bug_not_a_hang(tmp_path, monkeypatch):
    """The answer of an acks=all Produce is made once its fsync returns (`broker.net.later`): if
    making it raises, the request is answered UNKNOWN_SERVER_ERROR and logged as a handler bug,
    and the connection goes on (a Metadata behind it is answered); the Later it waited on is not
    left unresolved at the head of the connection's outbox, holding every answer behind it."""
    from test_dedup_raw import Client, Conn, parse_produce, start_broker

    from oncelog.broker.handlers import produce as handler

    broker, host, port = await start_broker(tmp_path)
    c = Client(await Conn.open(host, port))
    try:
        await c.create_topic("bug")
        real = handler.wire.encode_response
        calls = []

        def broken(version, topics, throttle_ms=0):   # the first answer only (the refusal is made too)
            calls.append(version)
            if len(calls) == 1:
                raise RuntimeError("an answer that cannot be encoded")
            return real(version, topics, throttle_ms)
        monkeypatch.setattr(handler.wire, "encode_response", broken)
        send_produce(c.conn.writer, "bug", 0, 300)
        send_metadata(c.conn.writer, 301)
        await c.conn.writer.drain()
        cid, data = await read_answer(c.conn.reader)
        assert cid == 300 and parse_produce(9, data[5:])[0]["error_code"] == -1   # UNKNOWN_SERVER_ERROR
        cid, _data = await read_answer(c.conn.reader)
        assert cid == 301
    finally:
        await c.conn.close()
        await broker.stop()
