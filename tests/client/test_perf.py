"""`oncelog perf produce`: kafka-producer-perf-test's flags and final line, and the delay proxy."""
import re
import time

from click.testing import CliRunner

from oncelog.cli.perf import ProxyProcess, perf

FINAL = re.compile(r"^(\d+) records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
                   r"[\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99.9th\.$")


def test_perf_produce_prints_kafka_final_line(rdkafka_mock):
    rdkafka_mock.create_topic("perf", 1)
    r = CliRunner().invoke(perf, ["produce", "--topic", "perf", "--num-records", "3000",
                                  "--record-size", "100", "--throughput", "-1", "--no-progress",
                                  "--producer-props", f"bootstrap.servers={rdkafka_mock.bootstrap}",
                                  "acks=all", "linger.ms=1"])
    assert r.exit_code == 0, r.output
    last = r.output.strip().splitlines()[-1]
    assert FINAL.match(last), last
    assert last.startswith("3000 records sent")


def test_perf_produce_through_delay_proxy_is_slower_per_record(rdkafka_mock):
    rdkafka_mock.create_topic("perfp", 1)
    r = CliRunner().invoke(perf, ["produce", "--topic", "perfp", "--num-records", "50",
                                  "--record-size", "100", "--throughput", "-1", "--no-progress",
                                  "--proxy-latency-ms", "40", "--producer-props",
                                  f"bootstrap.servers={rdkafka_mock.bootstrap}", "batch.size=1"])
    assert r.exit_code == 0, r.output
    m = re.search(r"(\d+) ms 50th", r.output)
    assert int(m.group(1)) >= 40, r.output   # every record waited at least one round trip


def test_delay_proxy_forwards_bytes_in_order():
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    got = bytearray()

    def echo():
        c, _ = srv.accept()
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
        c.close()
    threading.Thread(target=echo, daemon=True).start()
    px = ProxyProcess(f"127.0.0.1:{port}", 10)
    try:
        host, p = px.address.split(":")
        s = socket.create_connection((host, int(p)))
        payload = bytes(range(256)) * 4000
        t0 = time.monotonic()
        s.sendall(payload)
        while len(got) < len(payload):
            got += s.recv(1 << 20)
        assert time.monotonic() - t0 >= 0.02
        assert bytes(got) == payload
        s.close()
    finally:
        px.stop()
        srv.close()
