"""oncelog's producer chooses the transaction protocol as Kafka 4's Java producer does: Transactions
V2 where the cluster finalizes `transaction.version` 2 (the default), V1 where it does not, or when
told `oncelog.transaction.v2.enable=false`. Seen from outside, through a proxy that counts the
requests: under V2 no AddPartitionsToTxn or AddOffsetsToTxn goes out and every EndTxn bumps the
epoch (DescribeTransactions); under V1 they go out and the epoch stays. Either way the committed
records and offsets, and only those, are read back, by oncelog's read_committed consumer and
librdkafka's."""
from __future__ import annotations

import time

import pytest
from test_txn_producer import FAST, ck_values, create_topic, oncelog_values, wait_for_offset

from oncelog.client.sync import Producer
from oncelog.client.types import ConsumerGroupMetadata, TopicPartition
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.fault_proxy import ThreadedFaultProxy
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes


def finalize(bootstrap: str, level: int) -> None:
    """kafka-features.sh downgrade --feature transaction.version=<level>"""
    mod = entities.module(ApiKey.UPDATE_FEATURES, 1, "request")
    r = RawConnection(bootstrap).call(ApiKey.UPDATE_FEATURES, 1, validate_only=False, feature_updates=(
        entities.make(mod.FeatureUpdateKey, feature="transaction.version", max_version_level=level,
                      upgrade_type=2),))
    assert int(r.error_code) == 0, r


def epoch_of(bootstrap: str, tid: str) -> int:
    r = RawConnection(bootstrap).call(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(tid,))
    return int(r.transaction_states[0].producer_epoch)


@pytest.mark.parametrize("mode", ["v2", "v1-by-config", "v1-by-cluster"])
def test_the_producer_speaks_the_version_the_cluster_finalizes(tmp_path, mode):
    b = BrokerProcess(tmp_path / "data", FAST).start()
    try:
        bs = b.bootstrap
        create_topic(bs, "out", 2)
        create_topic(bs, "in", 1)
        if mode == "v1-by-cluster":
            finalize(bs, 1)
        v2 = mode == "v2"
        with ThreadedFaultProxy(bs) as px:
            conf = {"bootstrap.servers": px.bootstrap, "oncelog.address.map": f"{bs}={px.bootstrap}",
                    "transactional.id": f"tx-{mode}", "linger.ms": 0}
            if mode == "v1-by-config":
                conf["oncelog.transaction.v2.enable"] = "false"
            with Producer(conf) as p:
                p.init_transactions(30)
                _pid, epoch = p.transaction_ids
                for i, commit in enumerate([True, False, True]):
                    p.begin_transaction()
                    p.send("out", f"v{i}-0".encode(), partition=0)
                    p.send("out", f"v{i}-1".encode(), partition=1)
                    p.send_offsets_to_transaction({TopicPartition("in", 0): 10 * (i + 1)},
                                                  ConsumerGroupMetadata("copier"), 30)
                    p.flush(30)
                    (p.commit_transaction if commit else p.abort_transaction)(30)
                    assert p.transaction_ids[1] == (epoch + i + 1 if v2 else epoch)
                    assert epoch_of(bs, f"tx-{mode}") == p.transaction_ids[1]
            sent = px.stats.requests
            added = sent[ApiKey.ADD_PARTITIONS_TO_TXN] + sent[ApiKey.ADD_OFFSETS_TO_TXN]
            assert (added == 0) if v2 else (added >= 6), dict(sent)
            assert sent[ApiKey.END_TXN] == 3
        committed = sorted([b"v0-0", b"v0-1", b"v2-0", b"v2-1"])
        # EndTxn is answered once the commit is decided; the markers that move the LSO follow
        # (as Kafka's coordinator writes them): the last commit becomes readable soon after
        deadline = time.monotonic() + 30
        while (got := sorted(oncelog_values(bs, "out", 2, "read_committed"))) != committed:
            assert time.monotonic() < deadline and set(got) <= set(committed), got
        assert sorted(ck_values(bs, "out", 2, "read_committed", expect=4)) == committed
        wait_for_offset(bs, "copier", "in", 30)
    finally:
        b.stop()
