"""KIP-890 part 1 at the partition leader: a transactional Produce is appended only when its
producer has a transaction open in the partition at that epoch or the broker's `txn_verifier`
says the partition was added; a refusal is INVALID_TXN_STATE below Produce v11 and
TRANSACTION_ABORTABLE from v11; a marker that ends the transaction while a batch waits for its
verification refuses that batch. An in-process broker (real sockets, real files) so the test can
install the verifier the coordinator will provide."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from test_dedup_raw import Client, Conn, start_broker
from test_transactions_partition import A, Txn, batch

from oncelog.protocol.errors import ErrorCode as E

TOPIC = "verified"


def test_verification_hook(tmp_path):
    async def run():
        broker, host, port = await start_broker(tmp_path)
        # what Txn's markers need of a broker to log in as another one (start_broker's data dir)
        reach = SimpleNamespace(bootstrap=f"{host}:{port}", data_dir=tmp_path / "data")
        try:
            t = Txn(Client(await Conn.open(host, port)), TOPIC, reach)
            await t.client.create_topic(TOPIC)
            calls = []
            added: set[int] = set()

            async def verifier(tid, pid, epoch, topic, partition):
                calls.append((tid, pid, epoch, topic, partition))
                return E.NONE if pid in added else E.TRANSACTION_ABORTABLE
            broker.txn_verifier = verifier
            assert (await t.produce(batch(A, 0), version=9))["error_code"] == E.INVALID_TXN_STATE
            assert (await t.produce(batch(A, 0), version=11))["error_code"] == E.TRANSACTION_ABORTABLE
            assert calls[-1] == ("txn-a", A, 0, TOPIC, 0)
            added.add(A)
            assert (await t.produce(batch(A, 0), version=11))["error_code"] == 0
            n = len(calls)
            assert (await t.produce(batch(A, 2), version=11))["error_code"] == 0
            assert len(calls) == n  # open here at that epoch: no second verification
            assert await t.marker(A, commit=True) == 0

            # the transaction ends (a marker) while the next one's first batch waits
            release = asyncio.Event()

            async def slow(tid, pid, epoch, topic, partition):
                await release.wait()
                return E.NONE
            broker.txn_verifier = slow
            marker_conn = Txn(Client(await Conn.open(host, port)), TOPIC, reach)
            waiting = asyncio.create_task(t.produce(batch(A, 4), version=11))
            while not broker.logs.get_partition(TOPIC, 0)._verifying:
                await asyncio.sleep(0.01)
            assert await marker_conn.marker(A, commit=False) == 0
            release.set()
            assert (await waiting)["error_code"] == E.TRANSACTION_ABORTABLE
            assert broker.logs.get_partition(TOPIC, 0).txns.open_transactions() == []
        finally:
            await broker.stop()
    asyncio.run(run())
