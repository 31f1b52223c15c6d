"""Issue 24, finding 4: a Spark driver killed -9 while its batch's task transactions are open,
restarted from its checkpoint with fewer tasks (minPartitions dropped). The tasks that vanished
with the split left transactions that no replayed task shares an id with; unless the sink aborts
them, read_committed readers stall at their first offset until transaction.timeout.ms (15
minutes by the sink's default).

The drivers run in processes of their own (driver_process.py) so that the whole of one, JVM and
Python workers, can be killed at once."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from sessions import session_pids
from test_exactly_once import PAD, ROWS, _ids, client_values, kafka_python_values

from oncelog.client import AdminClient

pytestmark = [pytest.mark.processes, pytest.mark.spark]   # Spark drivers in subprocesses

DRIVER = os.path.join(os.path.dirname(__file__), "driver_process.py")


def _start(bootstrap, src, dst, ckpt, log, *extra):
    return subprocess.Popen([sys.executable, DRIVER, "--bootstrap", bootstrap, "--source", src,
                             "--sink", dst, "--checkpoint", ckpt, *extra],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_driver(proc: subprocess.Popen) -> None:
    for pid in session_pids(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(30)
    deadline = time.monotonic() + 30
    while session_pids(proc.pid):
        assert time.monotonic() < deadline, "processes of the killed driver survived"
        time.sleep(0.1)


def _wait(what: str, done, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while True:
        got = done()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _open_transactions(bootstrap: str, sink: str) -> set[str]:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        return {t["transactional_id"] for t in admin.list_transactions(["Ongoing"])
                if t["transactional_id"].startswith(sink + "-")}


def _query_id(ckpt: str) -> str:
    import json
    with open(os.path.join(ckpt, "metadata")) as f:
        return json.loads(f.read().splitlines()[-1])["id"]


def _stable(bootstrap, topic, partitions) -> bool:
    """Last stable offsets equal to the high watermarks: no transaction holds readers back."""
    from oncelog.client import Consumer, TopicPartition
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer({"auto.offset.reset": "earliest",
                   "bootstrap.servers": bootstrap, "isolation.level": "read_committed"}) as rc, \
            Consumer({"auto.offset.reset": "earliest", "bootstrap.servers": bootstrap}) as ru:
        return rc.end_offsets(tps) == ru.end_offsets(tps)


# The slow tier (make test-all): two Spark drivers of about 100 s each on one worker. In CI the
# kill -9 of a driver runs in the test below and in test_exactly_once's driver dying while
# committing, and a replay split into fewer tasks in test_exactly_once's
# test_replay_split_differently_after_a_partial_commit.
@pytest.mark.slow
def test_driver_killed_mid_batch_restarted_with_fewer_tasks(spark_broker, make_topic, produce,
                                                            tmp_path):
    src, dst = make_topic(2), make_topic(2)
    for p in (0, 1):
        produce(src, [f"{p}:{i}:".encode() + PAD for i in range(ROWS)], partition=p)
    ckpt = str(tmp_path / "ckpt")
    flags1, flags2 = tmp_path / "run1", tmp_path / "run2"
    flags1.mkdir()
    flags2.mkdir()
    log = open(tmp_path / "drivers.log", "ab")

    # Run 1: one batch of 4 tasks, p0[0,100) p0[100,200) p1[0,100) p1[100,200); task 3 stops
    # at p1 offset 190, when the rows the JVM passed on before it (about 40: it feeds the writer
    # 64 KB at a time) are in its transaction. Killed -9 once all four tasks have an open
    # transaction (three handed over to the driver, one in the middle of its rows).
    first = _start(spark_broker, src, dst, ckpt, log, "--min-partitions", "4",
                   "--block-at", "1:190", "--flags", str(flags1))
    try:
        _wait("run 1's task 3 to block", lambda: (flags1 / "blocked").exists())
        sink = _query_id(ckpt)
        deadline = time.monotonic() + 60
        while len(killed_run := _open_transactions(spark_broker, sink)) < 4:
            assert time.monotonic() < deadline, f"4 task transactions never open: {killed_run}"
            time.sleep(0.2)
    finally:
        _kill_driver(first)
    assert not _stable(spark_broker, dst, 2), "no transaction of the killed run is open"

    # Run 2, minPartitions dropped: batch 0 replays as 2 tasks, p0[0,200) and p1[0,200), so
    # no task takes over the ids of run 1's tasks 2 and 3. Task 1 stops at p1 offset 190: by
    # then the batch's first task has aborted every transaction the killed run left open.
    second = _start(spark_broker, src, dst, ckpt, log, "--block-at", "1:190",
                    "--flags", str(flags2))
    try:
        _wait("run 2's task 1 to block", lambda: (flags2 / "blocked").exists())
        deadline = time.monotonic() + 30
        while (left := killed_run & _open_transactions(spark_broker, sink)):
            assert time.monotonic() < deadline, \
                f"transactions of the killed driver still open while the restart runs: {left}"
            time.sleep(0.2)
        (flags2 / "release").touch()
        assert second.wait(300) == 0, f"the restarted query failed (see {tmp_path}/drivers.log)"
    finally:
        if second.poll() is None:
            _kill_driver(second)
    ended = time.monotonic()

    # within 30 s of the restarted query's end, read_committed readers see every row once
    while not _stable(spark_broker, dst, 2):
        assert time.monotonic() < ended + 30, (
            f"read_committed readers still held back 30 s after the restarted query ended; open: "
            f"{sorted(_open_transactions(spark_broker, sink))}")
        time.sleep(0.2)
    expect = {f"{p}:{i}".encode() for p in (0, 1) for i in range(ROWS)}
    for name, values in (("oncelog", client_values(spark_broker, dst, 2, "read_committed")),
                         ("kafka-python", kafka_python_values(spark_broker, dst, 2))):
        counts = _ids(values)
        assert set(counts) == expect, f"{name}: {len(expect - set(counts))} rows missing"
        assert max(counts.values()) == 1, f"{name}: duplicates"


# ------------------------------------------------------------------ issue 35: no window left
QUARTER = 25          # rows per task: 4 task transactions of 25 rows, as the review measured
# the review's 3 s; without two-phase commit a batch must also complete within it, which a
# loaded machine does not always manage: 10 s there (the slow tier)
TXN_TIMEOUT_MS = {"true": 3000, "false": 10000}


@contextlib.contextmanager
def _four_quarters(tmp_path):
    """A broker of its own (two-phase commit enabled, the timeout sweeper every 100 ms) with
    topics src and dst of 4 partitions and QUARTER rows in each of src's: four task transactions
    of 25 rows. Yields its bootstrap and the drivers' log."""
    from oncelog.client import Producer
    from oncelog.testing.embedded import BrokerProcess
    b = BrokerProcess(tmp_path / "data", {
        "transaction.state.log.num.partitions": "3", "transaction.two.phase.commit.enable": "true",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100"}).start()
    log = open(tmp_path / "drivers.log", "ab")
    try:
        bs = b.bootstrap
        with AdminClient({"bootstrap.servers": bs}) as admin:
            admin.create_topics(["src"], num_partitions=4)["src"].result()
            admin.create_topics(["dst"], num_partitions=4)["dst"].result()
        with Producer({"bootstrap.servers": bs}) as p:
            for part in range(4):
                for i in range(QUARTER):
                    p.send("src", f"{part}:{i}:".encode() + PAD, partition=part)
            p.flush()
        yield bs, log
    finally:
        log.close()
        b.stop()


def _killed_after_the_first_commit(bs, ckpt, log, flags, timeout_ms: int, *opts) -> Counter:
    """A driver (`opts`) that records its decision and commits the first of the four task
    transactions is killed -9 there (its commit() blocks, the test kills the whole process tree)
    and stays down 3x timeout_ms: the fault. Returns what read_committed readers see then: the
    first transaction's QUARTER rows only."""
    flags.mkdir()
    first = _start(bs, "src", "dst", ckpt, log, *opts, "--block-in-commit", "0:1", "--flags", str(flags))
    try:
        _wait("the driver to commit the first task transaction", lambda: (flags / "blocked").exists(), 300)
    finally:
        _kill_driver(first)
    time.sleep(3 * timeout_ms / 1000)   # the fault: the driver stays down 3x the timeout
    down = _ids(client_values(bs, "dst", 4, "read_committed"))
    assert set(down.values()) == {1} and len(down) == QUARTER, down
    return down


def _run_to_end(bs, ckpt, log, what: str, *opts) -> None:
    proc = _start(bs, "src", "dst", ckpt, log, *opts)
    try:
        assert proc.wait(300) == 0, f"{what} failed (see {log.name})"
    finally:
        if proc.poll() is None:
            _kill_driver(proc)


@pytest.mark.parametrize("two_phase", ["true", pytest.param("false", marks=pytest.mark.slow)])
@pytest.mark.timeout(600)   # two cold driver starts: 258 s once in CI, past the default 300 s once
def test_driver_killed_after_the_first_of_four_commits_and_down_3x_the_timeout(tmp_path, two_phase):
    """The review's scenario: a batch of four task transactions; the driver records its decision,
    commits the first of the four and is killed -9 (its commit() blocks there, the test kills
    the whole process tree); it stays down 3x transaction.timeout.ms with the coordinator's
    sweeper running every 100 ms; then it restarts from its checkpoint. With two-phase commit
    (KIP-939, the default where the broker enables it) the three prepared transactions outlive
    the downtime and the restarted driver completes them: read_committed readers see all 100
    rows, once. Without it (twoPhaseCommit=false, the path for brokers without KIP-939) the
    coordinator aborts them: 25 of 100 rows visible, as the review measured, and the restarted
    query goes on instead of failing at every restart."""
    with _four_quarters(tmp_path) as (bs, log):
        ckpt, timeout_ms = str(tmp_path / "ckpt"), TXN_TIMEOUT_MS[two_phase]
        opts = ["--option", f"kafka.transaction.timeout.ms={timeout_ms}", "--option", f"twoPhaseCommit={two_phase}"]
        down = _killed_after_the_first_commit(bs, ckpt, log, tmp_path / "flags", timeout_ms, *opts)
        _run_to_end(bs, ckpt, log, "the restarted query", *opts)
        expect = {f"{p}:{i}".encode() for p in range(4) for i in range(QUARTER)}
        for name, values in (("oncelog", client_values(bs, "dst", 4, "read_committed")),
                             ("kafka-python", kafka_python_values(bs, "dst", 4))):
            counts = _ids(values)
            assert max(counts.values()) == 1, f"{name}: duplicates"
            seen = len(set(counts) & expect)
            print(f"twoPhaseCommit={two_phase}: {name} read_committed sees {seen} of 100 rows "
                  f"({len(down)} while the driver was down)")
            if two_phase == "true":
                assert set(counts) == expect, f"{name}: {len(expect - set(counts))} rows missing"
            else:
                assert seen == QUARTER, f"{name}: {seen}"


def test_a_zombie_driver_and_its_replacement_on_one_sink(spark_broker, make_topic, produce, tmp_path):
    """Two drivers of one query (Spark does not stop a second one on another cluster): the first
    has its batch's task transactions prepared and is about to record its decision when it
    stalls (a zombie); the replacement starts on the same checkpoint, which fences the zombie's
    driver transactional id, replays the batch and completes it. The zombie then resumes: its
    decision is refused (PRODUCER_FENCED), its query fails, and it aborts nothing of the
    replacement's (a newer execution). Every row once."""
    src, dst = make_topic(2), make_topic(2)
    rows = 50
    for p in (0, 1):
        produce(src, [f"{p}:{i}:".encode() + PAD for i in range(rows)], partition=p)
    ckpt, flags = str(tmp_path / "ckpt"), tmp_path / "zombie"
    flags.mkdir()
    log = open(tmp_path / "drivers.log", "ab")
    zombie = _start(spark_broker, src, dst, ckpt, log, "--block-in-commit", "0:-1", "--flags", str(flags))
    replacement = None
    try:
        _wait("the zombie to stall before its decision", lambda: (flags / "blocked").exists(), 300)
        replacement = _start(spark_broker, src, dst, ckpt, log)
        assert replacement.wait(300) == 0, f"the replacement failed (see {tmp_path}/drivers.log)"
        (flags / "release").touch()
        assert zombie.wait(120) != 0, "the zombie's decision was accepted"
    finally:
        for proc in (zombie, replacement):
            if proc is not None and proc.poll() is None:
                _kill_driver(proc)
        log.close()
    assert b"fenced" in (tmp_path / "drivers.log").read_bytes()
    _wait("read_committed readers to reach the end", lambda: _stable(spark_broker, dst, 2), 30)
    expect = {f"{p}:{i}".encode() for p in (0, 1) for i in range(rows)}
    for name, values in (("oncelog", client_values(spark_broker, dst, 2, "read_committed")),
                         ("kafka-python", kafka_python_values(spark_broker, dst, 2))):
        counts = _ids(values)
        assert set(counts) == expect, f"{name}: {len(expect - set(counts))} rows missing"
        assert max(counts.values()) == 1, f"{name}: duplicates"


# three drivers started cold, one more than the other tests here: 162 s on an idle machine, near
# the 300 s default once the machine is loaded (each JVM start then takes a minute or more)
@pytest.mark.timeout(600)
@pytest.mark.slow   # CI: test_exactly_once's sinkId tests (runs twice, writes once; a retried task)
def test_a_batch_write_with_a_sink_id_is_completed_by_the_next_run_after_a_kill_9(tmp_path):
    """`df.write` with the option sinkId: the driver records its decision and completes the task
    transactions as a streaming micro-batch's driver does. Killed -9 right after the first of four
    task transactions committed, down 3x transaction.timeout.ms: the prepared ones outlive it, and
    the job run again with the same sinkId completes them and writes nothing more (100 of 100
    rows, once; a third run adds nothing). Before, a batch write recorded no decision and ignored
    sinkId (and the hook): the coordinator aborted the three by their timeout and the rerun, a new
    job, wrote all 100 again beside the first task's 25."""
    with _four_quarters(tmp_path) as (bs, log):
        timeout_ms, ckpt = TXN_TIMEOUT_MS["true"], str(tmp_path / "unused")
        job = ["--batch", "--option", "sinkId=nightly-2026-11-28",
               "--option", f"kafka.transaction.timeout.ms={timeout_ms}"]
        _killed_after_the_first_commit(bs, ckpt, log, tmp_path / "flags", timeout_ms, *job)
        expect = {f"{p}:{i}".encode() for p in range(4) for i in range(QUARTER)}
        for run in ("second", "third"):
            _run_to_end(bs, ckpt, log, f"the {run} run", *job)
            for name, values in (("oncelog", client_values(bs, "dst", 4, "read_committed")),
                                 ("kafka-python", kafka_python_values(bs, "dst", 4))):
                counts = _ids(values)
                assert max(counts.values()) == 1, f"{name} after the {run} run: duplicates"
                assert set(counts) == expect, f"{name} after the {run} run: {len(expect - set(counts))} rows missing"
        assert _stable(bs, "dst", 4)   # nothing left open
