"""`oncelog perf produce`: kafka-producer-perf-test's flags and final line, run as a user runs it."""
import re
import subprocess
import sys
import time

import pytest

from oncelog.client import AdminClient
from oncelog.client.sync import Consumer
from oncelog.client.types import TopicPartition
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.perf import DEFAULT_TRANSACTION_DURATION_MS, transaction_settings

FINAL = re.compile(r"^(\d+) records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
                   r"[\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99.9th\.$")


def perf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oncelog.cli.main", "perf", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.processes
def test_perf_produce_prints_kafka_final_line(rdkafka_mock):
    rdkafka_mock.create_topic("perf", 1)
    r = perf("produce", "--topic", "perf", "--num-records", "3000", "--record-size", "100",
             "--throughput", "-1", "--no-progress",
             "--producer-props", f"bootstrap.servers={rdkafka_mock.bootstrap}", "acks=all", "linger.ms=1")
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert FINAL.match(last), last
    assert last.startswith("3000 records sent")


@pytest.mark.processes
def test_perf_produce_through_delay_proxy_is_slower_per_record(rdkafka_mock):
    rdkafka_mock.create_topic("perfp", 1)
    r = perf("produce", "--topic", "perfp", "--num-records", "50", "--record-size", "100",
             "--throughput", "-1", "--no-progress", "--proxy-latency-ms", "40",
             "--producer-props", f"bootstrap.servers={rdkafka_mock.bootstrap}", "batch.size=1")
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"(\d+) ms 50th", r.stdout)
    assert int(m.group(1)) >= 40, r.stdout   # every record waited at least one round trip


def test_transactions_turn_on_as_in_kafkas_producer_performance():
    props = {"bootstrap.servers": "x:1"}
    assert transaction_settings(props, None, None) == (props, None)
    p, ms = transaction_settings(props, "t1", None)
    assert p["transactional.id"] == "t1" and ms == DEFAULT_TRANSACTION_DURATION_MS == 3000
    p, ms = transaction_settings({**props, "transactional.id": "in-props"}, None, None)
    assert p["transactional.id"] == "in-props" and ms == 3000
    p, ms = transaction_settings({**props, "transactional.id": "in-props"}, "flag", 50)
    assert p["transactional.id"] == "flag" and ms == 50     # the flag takes precedence
    p, ms = transaction_settings(props, None, 200)
    assert p["transactional.id"].startswith("performance-producer-") and ms == 200
    with pytest.raises(ValueError):
        transaction_settings(props, "t", 0)


def _read_committed_count(bootstrap: str, topic: str, partitions: int, expect: int) -> tuple[int, dict, dict]:
    """Records a read_committed consumer reads from the start, with the partitions' last stable
    offsets and high watermarks."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    committed = Consumer({"auto.offset.reset": "earliest",
                          "bootstrap.servers": bootstrap, "isolation.level": "read_committed"})
    uncommitted = Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": bootstrap})
    try:
        committed.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got += len(committed.poll(0.3))
            lso = committed.end_offsets(tps)
            if got >= expect and all((committed.position(tp) or 0) >= lso[tp] for tp in tps):
                break
        return got, committed.end_offsets(tps), uncommitted.end_offsets(tps)
    finally:
        committed.close()
        uncommitted.close()


@pytest.mark.processes
def test_transactional_perf_run_commits_every_record_and_leaves_no_open_transaction(tmp_path):
    b = BrokerProcess(tmp_path / "data", {"transaction.state.log.num.partitions": "3"}).start()
    try:
        topic, n = "perf-txn", 3000
        with AdminClient({"bootstrap.servers": b.bootstrap}) as admin:
            admin.create_topics([topic], num_partitions=2)[topic].result()
        # 10,000 records/s for 0.3 s with 50 ms transactions: several commits; the flags as the
        # KIP-1269 seed gives them (KIP-1147's --command-property)
        r = perf("produce", "--topic", topic, "--num-records", str(n), "--record-size", "100",
                 "--throughput", "10000", "--no-progress", "--transactional-id", "perf-tx",
                 "--transaction-duration-ms", "50", "--bootstrap-server", b.bootstrap,
                 "--command-property", "acks=all", "linger.ms=1")
        assert r.returncode == 0, r.stdout + r.stderr
        last = r.stdout.strip().splitlines()[-1]
        assert FINAL.match(last) and last.startswith(f"{n} records sent"), last
        got, lso, hw = _read_committed_count(b.bootstrap, topic, 2, n)
        assert got == n                                  # every record committed, none extra
        assert lso == hw                                 # no transaction left open
        markers = sum(hw.values()) - n                   # one control batch per commit and partition
        assert markers >= 2, (hw, r.stdout)
    finally:
        b.stop()
