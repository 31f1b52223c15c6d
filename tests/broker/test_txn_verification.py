"""KIP-890 part 1 at the partition leader: a transactional Produce is appended only when its
producer has a transaction open in the partition at that epoch or the broker's `txn_check`
(verify, below Produce v12) says the partition was added; a refusal is INVALID_TXN_STATE below Produce v11 and
TRANSACTION_ABORTABLE from v11; a marker that ends the transaction while a batch waits for its
verification refuses that batch. An in-process broker (real sockets, real files) so the test can
install the verifier the coordinator will provide."""
from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace

from test_dedup_raw import Client, Conn, parse_produce, produce_body, start_broker
from test_transactions_partition import NOW, A, Txn, batch, with_txn_id

from oncelog.protocol.errors import ErrorCode as E
from oncelog.protocol.records import Record, encode_batch

TOPIC = "verified"


def _reach(tmp_path, host: str, port: int) -> SimpleNamespace:
    """What Txn's markers need of a broker to log in as another one (start_broker's data dir)."""
    return SimpleNamespace(bootstrap=f"{host}:{port}", data_dir=tmp_path / "data")


async def _broker_with_topic(tmp_path):
    """An in-process broker, TOPIC created, and a transactional producer's connection to it:
    (broker, host, port, what its markers need, the producer)."""
    broker, host, port = await start_broker(tmp_path)
    reach = _reach(tmp_path, host, port)
    t = Txn(Client(await Conn.open(host, port)), TOPIC, reach)
    await t.client.create_topic(TOPIC)
    return broker, host, port, reach, t


def test_verification_hook(tmp_path):
    async def run():
        broker, host, port, reach, t = await _broker_with_topic(tmp_path)
        try:
            calls = []
            added: set[int] = set()

            async def verifier(tid, pid, epoch, partitions, add):
                calls.append((tid, pid, epoch, partitions, add))
                return dict.fromkeys(partitions, E.NONE if pid in added else E.TRANSACTION_ABORTABLE)
            broker.txn_check = verifier
            assert (await t.produce(batch(A, 0), version=9))["error_code"] == E.INVALID_TXN_STATE
            assert (await t.produce(batch(A, 0), version=11))["error_code"] == E.TRANSACTION_ABORTABLE
            assert calls[-1] == ("txn-a", A, 0, [(TOPIC, 0)], False)
            added.add(A)
            assert (await t.produce(batch(A, 0), version=11))["error_code"] == 0
            n = len(calls)
            assert (await t.produce(batch(A, 2), version=11))["error_code"] == 0
            assert len(calls) == n  # open here at that epoch: no second verification
            assert await t.marker(A, commit=True) == 0

            # the transaction ends (a marker) while the next one's first batch waits
            release = asyncio.Event()

            async def slow(tid, pid, epoch, partitions, add):
                await release.wait()
                return dict.fromkeys(partitions, E.NONE)
            broker.txn_check = slow
            marker_conn = Txn(Client(await Conn.open(host, port)), TOPIC, reach)
            waiting = asyncio.create_task(t.produce(batch(A, 4), version=11))
            while not broker.logs.get_partition(TOPIC, 0).verification_guards:
                await asyncio.sleep(0.01)
            assert await marker_conn.marker(A, commit=False) == 0
            release.set()
            assert (await waiting)["error_code"] == E.TRANSACTION_ABORTABLE
            assert broker.logs.get_partition(TOPIC, 0).txns.open_transactions() == []
        finally:
            await broker.stop()
    asyncio.run(run())


def _slow_verifier(broker):
    """A verifier that answers NONE once `release` is set; `calls` lists the checks asked."""
    release, calls = asyncio.Event(), []

    async def verifier(tid, pid, epoch, partitions, add):
        calls.append(pid)
        await release.wait()
        return dict.fromkeys(partitions, E.NONE)
    broker.txn_check = verifier
    return release, calls


async def _until(condition, timeout_s: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never met"
        await asyncio.sleep(0.01)


def _frame(correlation_id: int, records: bytes, version: int = 11) -> bytes:
    body = with_txn_id(produce_body(version, TOPIC, 0, records), version, "txn-a")
    header = struct.pack(">hhih", 0, version, correlation_id, 4) + b"test" + b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body


async def _answers(conn: Conn, n: int, version: int = 11) -> list[tuple[int, int]]:
    """(correlation id, error code) of the next n answers on the connection."""
    out = []
    for _ in range(n):
        size = struct.unpack(">i", await conn.reader.readexactly(4))[0]
        data = await conn.reader.readexactly(size)
        out.append((struct.unpack(">i", data[:4])[0], parse_produce(version, data[5:])[0]["error_code"]))
    return out


def test_a_produce_waiting_for_its_verification_holds_up_the_requests_behind_it(tmp_path):
    """Two transactional Produce requests written at once on one connection: the second starts
    only when the first is in the log, so it needs no verification (Kafka handles one request per
    connection at a time). Before, it started while the first waited and replaced its guard: the
    first was refused TRANSACTION_ABORTABLE and the second out of order (UNKNOWN_PRODUCER_ID here,
    the producer having nothing in the log yet)."""
    async def run():
        broker, host, port = await start_broker(tmp_path)
        try:
            t = Txn(Client(await Conn.open(host, port)), TOPIC, _reach(tmp_path, host, port))
            await t.client.create_topic(TOPIC)
            release, calls = _slow_verifier(broker)
            conn = t.client.conn
            conn.writer.write(_frame(100, batch(A, 0)) + _frame(101, batch(A, 2)))
            await conn.writer.drain()
            await _until(lambda: calls)
            release.set()
            assert await _answers(conn, 2) == [(100, E.NONE), (101, E.NONE)]
            assert calls == [A]
            assert broker.logs.get_partition(TOPIC, 0).log_end_offset == 4
        finally:
            await broker.stop()
    asyncio.run(run())


async def _waiting(conn: Conn, correlation_id: int, seq: int, calls: list) -> None:
    """A transactional Produce of producer A at `seq`, sent; returns once its check has begun."""
    asked = len(calls)
    conn.writer.write(_frame(correlation_id, batch(A, seq)))
    await conn.writer.drain()
    await _until(lambda: len(calls) == asked + 1)


def test_overlapping_checks_of_one_producer_share_its_guard(tmp_path):
    """The same producer's first batches on two connections, both waiting for the coordinator:
    the second check must not void the first (Kafka's maybeCreateVerificationStateEntry returns
    the producer's entry); a marker voids both."""
    async def run():
        broker, host, port = await start_broker(tmp_path)
        try:
            first = Txn(Client(await Conn.open(host, port)), TOPIC, _reach(tmp_path, host, port))
            await first.client.create_topic(TOPIC)
            second = Client(await Conn.open(host, port))
            partition = broker.logs.get_partition(TOPIC, 0)
            release, calls = _slow_verifier(broker)
            await _waiting(first.client.conn, 100, 0, calls)
            await _waiting(second.conn, 200, 2, calls)
            release.set()
            assert await _answers(first.client.conn, 1) == [(100, E.NONE)]
            assert await _answers(second.conn, 1) == [(200, E.NONE)]
            assert partition.log_end_offset == 4 and not partition.verification_guards
            assert await first.marker(A, commit=True) == 0

            # a marker while both wait: both refused, nothing appended
            release.clear()
            await _waiting(first.client.conn, 101, 4, calls)
            await _waiting(second.conn, 201, 6, calls)
            marker = Txn(Client(await Conn.open(host, port)), TOPIC, _reach(tmp_path, host, port))
            assert await marker.marker(A, commit=False) == 0
            release.set()
            assert await _answers(first.client.conn, 1) == [(101, E.TRANSACTION_ABORTABLE)]
            assert await _answers(second.conn, 1) == [(201, E.TRANSACTION_ABORTABLE)]
            assert partition.txns.open_transactions() == []
        finally:
            await broker.stop()
    asyncio.run(run())


def _epoch_batch(seq: int, epoch: int) -> bytes:
    """A transactional batch of producer A at `epoch` (Transactions V2 bumps it every transaction)."""
    return encode_batch([Record(0, NOW, None, b"a-%d-%d" % (epoch, seq), [])], producer_id=A,
                        producer_epoch=epoch, base_sequence=seq, transactional=True)


def test_the_previous_transactions_marker_does_not_void_a_transactions_v2_check(tmp_path):
    """Transactions V2: EndTxn bumps the epoch and its markers carry the new one, which is also
    the next transaction's. The next transaction's first batch here waits for its check (the
    coordinator retries CONCURRENT_TRANSACTIONS while the markers go out) and the previous
    transaction's marker (V2, WriteTxnMarkers v2) lands meanwhile, at the check's own epoch: it
    ended the transaction before, not this one, and must not void the check (Kafka's
    `updateProducers`: a TV2 check keeps its guard through a marker at its epoch). Before, the
    batch was refused TRANSACTION_ABORTABLE and the transaction aborted (once in CI, under kills
    and moves). A marker above the check's epoch (the transaction ended by a fence or a timeout)
    still voids it, and so does a V1 marker at its epoch (an EndTxn v4 that bumped nothing)."""
    async def run():
        broker, host, port, reach, t = await _broker_with_topic(tmp_path)
        try:
            partition = broker.logs.get_partition(TOPIC, 0)
            release, calls = _slow_verifier(broker)
            release.set()
            assert (await t.produce(_epoch_batch(0, 0), version=12))["error_code"] == E.NONE  # transaction N

            release.clear()
            n_plus_1 = asyncio.create_task(t.produce(_epoch_batch(0, 1), version=12))
            await _until(lambda: len(calls) == 2)
            marker = Txn(Client(await Conn.open(host, port)), TOPIC, reach)
            assert await marker.marker(A, commit=True, epoch=1, transaction_version=2) == 0   # N's, at the bumped epoch
            release.set()
            assert (await n_plus_1)["error_code"] == E.NONE
            assert partition.txns.open_transactions() == [(A, 2)]   # N at 0, its marker at 1

            # N+1 ends by a fence while N+2's first batch waits: its marker (epoch 2) voids the check
            assert await marker.marker(A, commit=False, epoch=2) == 0
            release.clear()
            n_plus_2 = asyncio.create_task(t.produce(_epoch_batch(0, 2), version=12))
            await _until(lambda: len(calls) == 3)
            assert await marker.marker(A, commit=False, epoch=3, transaction_version=2) == 0
            release.set()
            assert (await n_plus_2)["error_code"] == E.TRANSACTION_ABORTABLE
            assert partition.txns.open_transactions() == []

            # a V1 marker at the check's own epoch may end the check's own transaction: voided
            release.clear()
            at_3 = asyncio.create_task(t.produce(_epoch_batch(0, 3), version=12))
            await _until(lambda: len(calls) == 4)
            assert await marker.marker(A, commit=False, epoch=3) == 0
            release.set()
            assert (await at_3)["error_code"] == E.TRANSACTION_ABORTABLE
            assert partition.txns.open_transactions() == []
        finally:
            await broker.stop()
    asyncio.run(run())
