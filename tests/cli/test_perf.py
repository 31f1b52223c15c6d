"""`oncelog perf produce`: kafka-producer-perf-test's flags and final line, run as a user runs it."""
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes

FINAL = re.compile(r"^(\d+) records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
                   r"[\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99.9th\.$")


def perf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oncelog.cli.main", "perf", *args],
                          capture_output=True, text=True, timeout=120)


def test_perf_produce_prints_kafka_final_line(rdkafka_mock):
    rdkafka_mock.create_topic("perf", 1)
    r = perf("produce", "--topic", "perf", "--num-records", "3000", "--record-size", "100",
             "--throughput", "-1", "--no-progress",
             "--producer-props", f"bootstrap.servers={rdkafka_mock.bootstrap}", "acks=all", "linger.ms=1")
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert FINAL.match(last), last
    assert last.startswith("3000 records sent")


def test_perf_produce_through_delay_proxy_is_slower_per_record(rdkafka_mock):
    rdkafka_mock.create_topic("perfp", 1)
    r = perf("produce", "--topic", "perfp", "--num-records", "50", "--record-size", "100",
             "--throughput", "-1", "--no-progress", "--proxy-latency-ms", "40",
             "--producer-props", f"bootstrap.servers={rdkafka_mock.bootstrap}", "batch.size=1")
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"(\d+) ms 50th", r.stdout)
    assert int(m.group(1)) >= 40, r.stdout   # every record waited at least one round trip
