"""AdminClient.list_transactions against a 2-broker cluster: every broker coordinates the
transactional ids of its own `__transaction_state` partitions, so the list is the union of all
brokers' answers (the Spark sink finds the transactions a dead driver left open with it)."""
from __future__ import annotations

import asyncio

import pytest

from oncelog.client import AdminClient, Producer
from oncelog.client.aio import wire
from oncelog.client.aio.admin import AIOAdminClient
from oncelog.protocol.api import ApiKey
from oncelog.protocol.entities import RequestBuilder
from oncelog.testing.cluster import LocalCluster

pytestmark = pytest.mark.processes


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(tmp_path, 2, {"transaction.state.log.num.partitions": "4"},
                     proxies=False).start()
    yield c
    c.stop()


def _per_broker(bootstrap: str) -> dict[int, set[str]]:
    """What each broker alone lists (any state)."""
    async def run():
        admin = await AIOAdminClient({"bootstrap.servers": bootstrap}).start()
        try:
            out = {}
            for node in sorted(admin.cluster.brokers):
                conn = await admin.cluster.connection(node)
                v = conn.version(ApiKey.LIST_TRANSACTIONS)
                req = RequestBuilder(ApiKey.LIST_TRANSACTIONS, v).encode(
                    state_filters=(), producer_id_filters=())
                r = wire.decode(ApiKey.LIST_TRANSACTIONS, v,
                                await conn.request(ApiKey.LIST_TRANSACTIONS, v, req))
                out[node] = {t.transactional_id for t in r.transaction_states}
            return out
        finally:
            await admin.close()
    return asyncio.run(run())


def test_list_transactions_asks_every_broker(cluster):
    bs = cluster.bootstrap
    with AdminClient({"bootstrap.servers": bs}) as admin:
        admin.create_topics(["t"], num_partitions=1)["t"].result()
    producers = {}
    for i in range(8):
        tid = f"lt-{i}"
        p = producers[tid] = Producer({"bootstrap.servers": bs, "transactional.id": tid})
        p.init_transactions(60)
        p.begin_transaction()
        p.send("t", tid.encode(), partition=0)
        p.flush(30)
    producers["lt-0"].commit_transaction(30)
    try:
        alone = _per_broker(bs)
        everyone = {f"lt-{i}" for i in range(8)}
        assert all(ids and ids < everyone for ids in alone.values()), alone   # spread over both
        with AdminClient({"bootstrap.servers": bs}) as admin:
            ongoing = admin.list_transactions(["Ongoing"])
            assert {t["transactional_id"] for t in ongoing} == everyone - {"lt-0"}
            assert all(t["state"] == "Ongoing" and t["producer_id"] >= 0 for t in ongoing)
            assert {t["transactional_id"] for t in admin.list_transactions()} == everyone
    finally:
        for p in producers.values():
            p.close(5)
