"""One process per data directory (issue 24, finding 6): two `oncelog serve` on one `--log-dirs`
both started and both acknowledged writes, and the second overwrote the first's records. Kafka
locks each log directory; so does oncelog: the second process exits with one line naming the
directory and the process holding it, and a killed holder's lock goes with it."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.testing.embedded import BrokerProcess, ControllerProcess, free_port

pytestmark = pytest.mark.processes


def _oncelog(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oncelog.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout)


# the line docs/operations.md shows, with the path, pid and command line left open
_LOCKED = re.compile(r"oncelog: (?P<dir>\S+) is in use by process (?P<pid>\d+) \((?P<cmd>.+)\): not starting a broker "
                     r"on it \(lock file \.lock\)")


def _refused(result: subprocess.CompletedProcess, directory, holder_pid: int) -> None:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr   # one line, no traceback
    assert str(directory) in lines[0] and f"process {holder_pid}" in lines[0], lines[0]
    assert "listening on" not in result.stdout   # it never served


def test_the_lock_message_in_the_docs_is_the_one_printed(tmp_path):
    """docs/operations.md shows the line a second broker prints (it said `Error: ...`)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    shown = [line for line in doc.splitlines() if "is in use by process" in line]
    assert shown and all(_LOCKED.fullmatch(line) for line in shown), shown
    data = tmp_path / "data"
    with BrokerProcess(data) as first:
        second = _oncelog("serve", "--log-dirs", str(data), "--listeners", "PLAINTEXT://127.0.0.1:0")
        m = _LOCKED.fullmatch(second.stderr.strip())
        assert m is not None, second.stderr
        assert first.proc is not None and m["dir"] == str(data) and int(m["pid"]) == first.proc.pid


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    errors = []
    for v in values:
        p.produce(topic, v, partition=0, on_delivery=lambda err, _msg: err and errors.append(err))
    assert p.flush(30) == 0 and not errors, errors


def _read_all(bootstrap: str, topic: str, n: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "lock-check", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    try:
        for _ in range(200):
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg.value())
            if len(out) >= n:
                break
    finally:
        c.close()
    return out


def test_a_second_broker_on_the_same_directory_refuses_to_start_and_writes_nothing(tmp_path):
    data = tmp_path / "data"
    with BrokerProcess(data, {"num.partitions": "1"}) as first:
        _produce(first.bootstrap, "kept", [b"B1"])
        second = _oncelog("serve", "--log-dirs", str(data), "--listeners",
                          f"PLAINTEXT://127.0.0.1:{free_port()}")
        assert first.proc is not None
        _refused(second, data, first.proc.pid)
        _produce(first.bootstrap, "kept", [b"B2"])
        assert _read_all(first.bootstrap, "kept", 2) == [b"B1", b"B2"]


def test_the_lock_of_a_killed_broker_is_gone_and_a_new_broker_keeps_its_records(tmp_path):
    data = tmp_path / "data"
    first = BrokerProcess(data, {"num.partitions": "1"}).start()
    try:
        _produce(first.bootstrap, "kept", [b"B1", b"B2"])
        first.kill()   # SIGKILL: the kernel drops the lock with the process
        again = BrokerProcess(data, {"num.partitions": "1"}).start()
        try:
            assert _read_all(again.bootstrap, "kept", 2) == [b"B1", b"B2"]
        finally:
            again.stop()
    finally:
        first.stop()


def test_a_second_controller_on_a_metadata_directory_refuses_to_start(tmp_path):
    with ControllerProcess(tmp_path / "metadata") as first:
        second = _oncelog("controller", "--metadata-dir", str(tmp_path / "metadata"))
        assert first.proc is not None
        _refused(second, tmp_path / "metadata", first.proc.pid)


def test_serve_brokers_holds_its_shared_directory_against_either_kind_of_serve(tmp_path):
    data = tmp_path / "data"
    cluster = subprocess.Popen([sys.executable, "-m", "oncelog.cli.main", "serve", "--log-dirs", str(data),
                                "--brokers", "2", "--listeners", "PLAINTEXT://127.0.0.1:0",
                                "--override", "metrics.port=-1"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert cluster.stdout is not None
        for line in cluster.stdout:
            if "cluster of 2 brokers" in line:
                break
        else:  # (ports 0: the brokers' ports count up from the given one, which may be taken)
            pytest.fail(f"serve --brokers 2 did not start (exit {cluster.wait()})")
        alone = _oncelog("serve", "--log-dirs", str(data), "--listeners", f"PLAINTEXT://127.0.0.1:{free_port()}")
        assert alone.returncode != 0 and len(alone.stderr.strip().splitlines()) == 1, alone.stderr
        assert str(data) in alone.stderr and "listening on" not in alone.stdout
        twice = _oncelog("serve", "--log-dirs", str(data), "--brokers", "2", "--listeners", "PLAINTEXT://127.0.0.1:0")
        _refused(twice, data, cluster.pid)
    finally:
        cluster.terminate()
        cluster.wait(60)
