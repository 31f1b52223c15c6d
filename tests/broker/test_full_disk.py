"""A full disk, on a real small filesystem (a tmpfs, else an ext4 loop file; skipped only where
neither can be mounted) and, everywhere, through the ENOSPC failpoint (issue 39 item 1):

- the broker logs the cause a few times, then counts, while producers keep trying;
- oncelog's producer and `oncelog produce` name KAFKA_STORAGE_ERROR while they retry, and in
  the final "not acknowledged" line;
- the reserve (`storage.min.free.bytes`, Redpanda's storage_min_free_bytes) refuses Produce while
  group commits, snapshots and the metadata log still write; a gauge shows the free space;
- SIGTERM on a full disk exits cleanly; a start on a full disk says the disk is full (it said
  "cannot bind the in-process controller");
- nothing acknowledged is lost once space returns."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from tests.cli.oncelog_cli import oncelog

from oncelog.client import AdminClient, Consumer, Producer
from oncelog.client.types import TopicPartition
from oncelog.testing.embedded import BrokerProcess, free_port
from oncelog.testing.workloads import read_range

pytestmark = [pytest.mark.timeout(300), pytest.mark.processes]

MiB = 1 << 20
WRITE_FAILED = "write failed, nothing appended"


# ------------------------------------------------------------------ a small filesystem

def _mount(args: list[str]) -> str | None:
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")


@contextlib.contextmanager
def small_filesystem(where: Path, size_mib: int):
    """A filesystem of `size_mib` MiB mounted at `where`: a tmpfs, else an ext4 loop file; the
    test is skipped, with both reasons, where neither can be mounted (not root, no CAP_SYS_ADMIN)."""
    where.mkdir(parents=True, exist_ok=True)
    why = _mount(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(where)])
    if why is not None:
        image = where.parent / f"{where.name}.img"
        with open(image, "wb") as f:
            f.truncate(size_mib * MiB)
        loop_why = _mount(["mkfs.ext4", "-q", "-F", str(image)]) or _mount(
            ["mount", "-o", "loop", str(image), str(where)])
        if loop_why is not None:
            pytest.skip(f"no small filesystem can be mounted here: tmpfs: {why}; loop file: {loop_why}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int) -> Path:
    """A filler file that leaves about `leave` bytes free (0: every block taken)."""
    filler = path / "filler"
    with open(filler, "ab") as f:
        chunk = b"\0" * (64 * 1024)
        while free_bytes(path) > leave:
            want = min(len(chunk), free_bytes(path) - leave)
            try:
                f.write(chunk[:max(want, 4096)])
                f.flush()
            except OSError:
                break
    return filler


def broker_on(fs: Path, logs: Path, **overrides: str) -> BrokerProcess:
    # the broker's own log stays off the small filesystem: what it says must not fill it
    return BrokerProcess(fs / "data", overrides, log_file=logs / "broker.log")


def lines(b: BrokerProcess, needle: str) -> list[str]:
    return [line for line in b.log_tail(10**7).splitlines() if needle in line]


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class Sender:
    """oncelog's producer sending numbered records from a thread until told to stop; what was
    acknowledged is kept (to be found after space returns)."""

    def __init__(self, bootstrap: str, topic: str, size: int = 2000) -> None:
        self.p = Producer({"bootstrap.servers": bootstrap, "delivery.timeout.ms": 240000, "linger.ms": 5,
                           "retry.backoff.ms": 50})
        self.topic, self.size = topic, size
        self.acked: set[bytes] = set()
        self.failed: list[BaseException] = []
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _done(self, err, meta, value: bytes) -> None:
        if err is None:
            self.acked.add(value)
        else:
            self.failed.append(err)

    def _run(self) -> None:
        while not self.stop.is_set():
            value = b"%08d" % self.sent + b"x" * (self.size - 8)
            self.p.send(self.topic, value, partition=0, on_delivery=lambda e, m, v=value: self._done(e, m, v))
            self.sent += 1
            if self.sent % 50 == 0:
                time.sleep(0.01)

    def start(self) -> Sender:
        self.thread.start()
        return self

    def pending(self) -> int:
        return self.sent - len(self.acked) - len(self.failed)


def scrape_free(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert re.search(r"^oncelog_storage_min_free_bytes \S+$", text, re.M), text[-3000:]
    free = re.search(r'^oncelog_storage_disk_free_bytes\{directory="[^"]+"\} (\S+)$', text, re.M)
    assert free is not None, text[-3000:]
    return float(free.group(1))


def readable(bootstrap: str, topic: str) -> list[bytes]:
    got = read_range(bootstrap, topic, timeout_s=60)[0][0]
    return [v for _offset, v in got]


# ------------------------------------------------------------------ the real full disk

def test_a_full_disk_end_to_end(tmp_path, caplog):
    with small_filesystem(tmp_path / "small", 48) as fs:
        b = broker_on(fs, tmp_path, **{"storage.min.free.bytes": "0", "log.segment.bytes": str(4 * MiB)})
        b.start(timeout_s=120)
        try:
            with AdminClient({"bootstrap.servers": b.bootstrap}) as a:
                a.create_topics(["full"])["full"].result(60)
            filler = fill(fs, leave=3 * MiB)
            began = time.monotonic()
            with caplog.at_level(logging.WARNING, logger="oncelog.client.producer.retries"):
                s = Sender(b.bootstrap, "full").start()
                # the disk fills: appends fail, the producer keeps them and retries
                wait_for(lambda: lines(b, WRITE_FAILED), 120, "a write to fail")
                retried = s.p.stats.get("retries", 0)
                # dozens of appends refused while the producer keeps trying
                wait_for(lambda: s.p.stats.get("retries", 0) >= retried + 40, 60, "forty retries")
                s.stop.set()
                s.thread.join(30)
                assert s.pending() > 0 and not s.failed, (s.pending(), s.failed[:1])
            # the broker said why, a few times a minute, not ten times a second
            minutes = (time.monotonic() - began) / 60
            failed = lines(b, WRITE_FAILED)
            assert 1 <= len(failed) <= 3 * (int(minutes) + 1), failed
            assert "No space left on device" in failed[0]
            # the producer named the error it was answered, a few times every 30 s too
            retries = [r.getMessage() for r in caplog.records if r.name == "oncelog.client.producer.retries"]
            assert retries and all("KAFKA_STORAGE_ERROR" in m for m in retries), retries[:3]
            assert len(retries) <= 3 * (int(minutes * 2) + 1), retries
            assert s.p.stats["retries"] > 4 * len(retries)

            # `oncelog produce` says so while it retries, and in its last line (records larger
            # than the slack a file's last page may still have)
            fill(fs, leave=0)
            r = oncelog("produce", "full", "-X", "delivery.timeout.ms=6000", "-X", "request.timeout.ms=2000",
                        "-X", "linger.ms=0", bootstrap=b.bootstrap, stdin=("x" * 6000 + "\n") * 2)
            assert r.code == 1, r
            err = r.err.strip().splitlines()
            assert any("KAFKA_STORAGE_ERROR" in line and "retrying" in line for line in err[:-1]), err
            assert "not acknowledged" in err[-1] and "KAFKA_STORAGE_ERROR" in err[-1], err[-1]
            assert "Traceback" not in r.err

            # SIGTERM on the full disk: a clean exit, no traceback
            assert b.stop() == 0, b.log_tail()
            assert "Traceback" not in b.log_tail(10**7), b.log_tail()

            # a start on the full disk says the disk is full, not that a port cannot be bound
            started = subprocess.run(b.command() + ["--override", "storage.min.free.bytes=0"],
                                     capture_output=True, text=True, timeout=120)
            if started.returncode == 0 or "listening on" in started.stdout:
                pytest.fail(f"a broker started on a full disk: {started.stdout[-2000:]}")
            said = started.stderr.strip().splitlines()
            assert said and "no space left" in said[-1] and "disk is full" in said[-1], started.stderr[-2000:]
            assert "bind" not in said[-1] and "Traceback" not in started.stderr, started.stderr[-2000:]

            # space returns: the records the producer still held are delivered, and every record
            # acknowledged before is there, once
            filler.unlink()
            b.start(timeout_s=120)
            s.p.close(120)
            got = readable(b.bootstrap, "full")
            assert len(got) == len(set(got))
            assert s.acked <= set(got), len(s.acked - set(got))
            assert not s.failed, s.failed[:1]
            assert len(s.acked) == s.sent
        finally:
            b.stop()


def test_the_reserve_keeps_commits_and_snapshots_writable(tmp_path):
    with small_filesystem(tmp_path / "small", 48) as fs:
        metrics = free_port()
        b = broker_on(fs, tmp_path, **{"storage.min.free.bytes": str(12 * MiB), "metrics.port": str(metrics)})
        b.start(timeout_s=120)
        try:
            boot = b.bootstrap
            with AdminClient({"bootstrap.servers": boot}) as a:
                a.create_topics(["kept"])["kept"].result(60)
            with Producer({"bootstrap.servers": boot}) as p:
                acked = [p.send("kept", b"before-%d" % i, partition=0).result(30).offset for i in range(20)]
            assert scrape_free(metrics) > 12 * MiB
            fill(fs, leave=8 * MiB)        # below the reserve: the disk still has room
            # the gauge shows it (and a scrape reads the space afresh, for Produce too)
            wait_for(lambda: scrape_free(metrics) < 12 * MiB, 30, "the gauge to show the reserve reached")
            with Producer({"bootstrap.servers": boot, "delivery.timeout.ms": 3000, "request.timeout.ms": 2000,
                           "linger.ms": 0}) as p:
                with pytest.raises(Exception, match="KAFKA_STORAGE_ERROR") as refused:
                    p.send("kept", b"refused", partition=0).result(30)
            assert "storage.min.free.bytes" in str(refused.value)

            # what the broker must still write goes on: a group's commit ...
            tp = TopicPartition("kept", 0)
            with Consumer({"bootstrap.servers": boot, "group.id": "reserve-readers",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False}) as c:
                c.assign([tp])
                got = []
                deadline = time.monotonic() + 30
                while len(got) < 20 and time.monotonic() < deadline:
                    got += c.poll(0.5)
                c.commit(offsets=[TopicPartition("kept", 0, 20)], asynchronous=False)
                assert c.committed([tp], timeout=30)[0].offset == 20
            # ... the controller's metadata log (a topic created below the reserve) ...
            with AdminClient({"bootstrap.servers": boot}) as a:
                a.create_topics(["made-in-the-reserve"])["made-in-the-reserve"].result(60)
            # ... and the snapshots of a clean stop, with the metadata log's
            assert b.stop() == 0
            assert "Traceback" not in b.log_tail(10**7)
            pstates = list((fs / "data").glob("kept-0/*.pstate"))
            assert pstates, sorted(p.name for p in (fs / "data" / "kept-0").iterdir())
            b.start(timeout_s=120)
            with Consumer({"bootstrap.servers": boot, "group.id": "reserve-readers"}) as c:
                assert c.committed([tp], timeout=30)[0].offset == 20
                assert "made-in-the-reserve" in c.list_topics()
            assert [int(v.split(b"-")[1]) for v in readable(b.bootstrap, "kept")] == list(range(20))
            assert acked == list(range(20))
        finally:
            b.stop()


# ------------------------------------------------------------------ everywhere: the failpoint

def test_enospc_on_every_append_is_logged_a_few_times(tmp_path, caplog):
    """The same cause through the failpoint (no mount needed): every append of the partition
    meets ENOSPC while a producer retries for seconds."""
    b = BrokerProcess(tmp_path / "data", env={"ONCELOG_FAILPOINTS": "enospc:log:match=nospace-0:times=0"})
    b.start()
    try:
        with AdminClient({"bootstrap.servers": b.bootstrap}) as a:
            a.create_topics(["nospace"])["nospace"].result(60)
        with caplog.at_level(logging.WARNING, logger="oncelog.client.producer.retries"):
            with Producer({"bootstrap.servers": b.bootstrap, "delivery.timeout.ms": 5000,
                           "request.timeout.ms": 2000, "linger.ms": 0, "retry.backoff.ms": 20}) as p:
                futures = [p.send("nospace", b"%d" % i, partition=0) for i in range(20)]
                for f in futures:
                    with pytest.raises(Exception, match="not delivered.*last error: KAFKA_STORAGE_ERROR"):
                        f.result(60)
        failed = lines(b, WRITE_FAILED)
        assert 1 <= len(failed) <= 3, failed   # about a hundred appends failed
        retries = [r.getMessage() for r in caplog.records if r.name == "oncelog.client.producer.retries"]
        assert 1 <= len(retries) <= 4 and "KAFKA_STORAGE_ERROR" in retries[0], retries
    finally:
        b.stop()
    assert b.proc is not None and b.proc.returncode == 0
    assert "Traceback" not in b.log_tail(10**7)


def test_a_start_that_meets_a_storage_error_says_so_in_one_line(tmp_path):
    """The controller's metadata log meets ENOSPC as a fresh broker starts (this disk has room:
    the failpoint): one line names the storage error, no traceback, no port."""
    b = BrokerProcess(tmp_path / "data", env={"ONCELOG_FAILPOINTS": "enospc:metadata:times=0"})
    (tmp_path / "data").mkdir()
    started = subprocess.run(b.command(), capture_output=True, text=True, timeout=120,
                             env={**os.environ, **b.env})
    said = started.stderr.strip().splitlines()
    assert started.returncode != 0, started.stdout[-2000:]
    assert said and said[-1].startswith("oncelog: a storage error stopped the start (KAFKA_STORAGE_ERROR"), \
        started.stderr[-3000:]
    assert "bind" not in said[-1] and "Traceback" not in started.stderr
    assert "No space left on device" in started.stderr   # the log line above it names the cause


def test_free_space_is_read_at_most_every_max_age(tmp_path):
    from oncelog.storage.disk_space import DiskSpace
    now = [0.0]
    d = DiskSpace([tmp_path], min_free_bytes=1 << 62, max_age_s=0.5, clock=lambda: now[0])
    first = d.usage(tmp_path.resolve())
    assert first.free >= 0 and first.total == shutil.disk_usage(tmp_path).total
    assert d.usage(tmp_path.resolve()) is first          # cached
    now[0] = 0.5
    assert d.usage(tmp_path.resolve()) is not first      # read again
    refusal = d.produce_refusal(tmp_path / "topic-0")
    assert refusal is not None and "storage.min.free.bytes" in refusal
    assert d.produce_refusal("/elsewhere") is None       # not a data directory's partition
    assert DiskSpace([tmp_path], 0).produce_refusal(tmp_path / "topic-0") is None   # 0: no reserve
