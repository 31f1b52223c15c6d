"""examples/two_phase_commit_sqlite.py under kill -9 at each step: SQLite is the transaction
manager of a two-phase commit with an oncelog transaction (KIP-939). The writer (a process of its
own) is killed by its failpoints after it produced and before it prepared, after it prepared and
before its database transaction began, inside that transaction before COMMIT, after COMMIT and
before it completed the Kafka transaction, after it completed, and in its recovery after
init_transactions kept the open transaction; and "during complete" by a proxy that holds the
broker's answer to EndTxn (the coordinator has it) while the writer is killed. Also: a zombie writer
that wakes up after its successor recovered, and the broker killed -9 along with the writer.

After each crash the in-doubt state is checked as it should be (the database and the log disagree
only in a transaction that is still open), then a restarted writer recovers (and says whether it
committed or aborted), and then: no transaction open, and the order ids in the SQLite table are
exactly those that read_committed consumers read, each once, in oncelog's consumer, librdkafka's
(confluent-kafka) and kafka-python's. A last run writes the rest: every order in both, once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from oncelog.client import AdminClient
from oncelog.protocol.api import ApiKey
from oncelog.testing.embedded import BrokerProcess
from oncelog.testing.fault_proxy import FaultConfig, ThreadedFaultProxy

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "two_phase_commit_sqlite.py")
sys.path.insert(0, os.path.dirname(EXAMPLE))
import two_phase_commit_sqlite as example  # noqa: E402

pytestmark = pytest.mark.processes

ORDERS, BATCH = 50, 10
DEADLINE_S = 60
KILLED = -signal.SIGKILL
# no transaction open: the last one ended (Empty: an InitProducerId since, a recovery's)
ENDED = ("CompleteCommit", "CompleteAbort", "Empty")


class Writer:
    """One database, topic and transactional id; runs of the example's writer against them."""

    def __init__(self, bootstrap: str, tmp_path: Path) -> None:
        self.bootstrap = bootstrap
        self.db = str(tmp_path / "orders.db")
        tag = uuid.uuid4().hex[:8]
        self.topic, self.tid = f"orders-{tag}", f"orders-writer-{tag}"

    def command(self, *extra: str, bootstrap: str | None = None, config: tuple[str, ...] = ()) -> list[str]:
        return [sys.executable, EXAMPLE, "run", "--bootstrap", bootstrap or self.bootstrap, "--db", self.db,
                "--topic", self.topic, "--transactional-id", self.tid, "--orders", str(ORDERS),
                "--batch-size", str(BATCH), *extra, *(a for kv in config for a in ("-X", kv))]

    @staticmethod
    def env(failpoint: str | None) -> dict:
        env = {k: v for k, v in os.environ.items() if k != example.FAILPOINT_ENV}
        if failpoint:
            env[example.FAILPOINT_ENV] = failpoint
        return env

    def run(self, *extra: str, failpoint: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*extra), env=self.env(failpoint), capture_output=True, text=True,
                              timeout=240, check=False)

    def start(self, *extra: str, failpoint: str | None = None, bootstrap: str | None = None,
              config: tuple[str, ...] = ()) -> subprocess.Popen:
        return subprocess.Popen(self.command(*extra, bootstrap=bootstrap, config=config), env=self.env(failpoint),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def recover(self, expected: str) -> None:
        r = self.run("--recover-only")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"recovery: {expected} " in r.stdout, r.stdout

    def state(self) -> str:
        with AdminClient({"bootstrap.servers": self.bootstrap}) as admin:
            return admin.describe_transaction(self.tid).state

    def wait_for_state(self, *states: str) -> str:
        deadline = time.monotonic() + DEADLINE_S
        while (s := self.state()) not in states:
            assert time.monotonic() < deadline, f"{self.tid} is {s}, not {states}"
            time.sleep(0.05)
        return s

    def rows(self) -> list[int]:
        return example.database_orders(self.db)

    def check_agreement(self, expected_rows: int) -> None:
        """No transaction open; the table holds orders 0..expected_rows-1, and read_committed
        consumers of three clients read exactly those, each once."""
        self.wait_for_state(*ENDED)
        rows = self.rows()
        assert rows == list(range(expected_rows))
        for name, read in (("oncelog", lambda: example.read_orders(self.bootstrap, self.topic)),
                           ("confluent-kafka", lambda: confluent_orders(self.bootstrap, self.topic)),
                           ("kafka-python", lambda: kafka_python_orders(self.bootstrap, self.topic))):
            got = read()
            dup = [i for i, n in Counter(got).items() if n > 1]
            assert not dup, f"{name}: duplicates {dup}"
            assert sorted(got) == rows, f"{name}: only in the topic {sorted(set(got) - set(rows))}, " \
                                        f"only in the database {sorted(set(rows) - set(got))}"

    def check_command(self) -> tuple[int, dict]:
        """The example's `check`: its exit code and what it printed."""
        r = subprocess.run([sys.executable, EXAMPLE, "check", "--bootstrap", self.bootstrap, "--db", self.db,
                            "--topic", self.topic], capture_output=True, text=True, timeout=240, check=False)
        return r.returncode, json.loads(r.stdout.splitlines()[-1])

    def finish(self) -> None:
        """A last run writes the rest: all ORDERS orders in both, each once."""
        r = self.run()
        assert r.returncode == 0, r.stdout + r.stderr
        self.check_agreement(ORDERS)


def confluent_orders(bootstrap: str, topic: str) -> list[int]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        parts = range(example.PARTITIONS)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), 30)[1] for p in parts}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        got: list[int] = []
        deadline = time.monotonic() + DEADLINE_S
        while any(ends[tp.partition] > 0 and tp.offset < ends[tp.partition]
                  for tp in c.position([TopicPartition(topic, p) for p in parts])):
            assert time.monotonic() < deadline, f"confluent-kafka: not at {ends} after {DEADLINE_S}s"
            got += [json.loads(m.value())["order_id"] for m in c.consume(500, 0.2) if not m.error()]
        return got
    finally:
        c.close()


def kafka_python_orders(bootstrap: str, topic: str) -> list[int]:
    from kafka import KafkaConsumer, TopicPartition
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", isolation_level="read_committed")
    try:
        tps = [TopicPartition(topic, p) for p in range(example.PARTITIONS)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        got: list[int] = []
        deadline = time.monotonic() + DEADLINE_S
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"kafka-python: not at {ends} after {DEADLINE_S}s"
            got += [json.loads(m.value)["order_id"] for ms in c.poll(timeout_ms=200).values() for m in ms]
        return got
    finally:
        c.close()


def wait_stopped(proc: subprocess.Popen) -> None:
    """Until the process stopped itself (SIGSTOP at its failpoint)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        assert time.monotonic() < deadline, "the writer never reached its failpoint"
        time.sleep(0.02)


# (step, batch): where the writer is killed; what the recovery does; the batches the database
# committed by then (and Kafka once recovered)
KILLS = [
    ("produced", 2, "aborted", 2),
    ("prepared", 2, "aborted", 2),
    ("db-written", 0, "aborted", 0),     # the first batch: the database recorded no state yet
    ("db-written", 2, "aborted", 2),
    ("db-committed", 2, "committed", 3),
    ("completed", 2, "nothing open", 3),
]


@pytest.mark.parametrize(("step", "batch", "recovery", "committed"), KILLS,
                         ids=[f"{s}-{b}" for s, b, _r, _c in KILLS])
def test_a_kill_9_at_each_step_leaves_database_and_log_in_agreement(shared_broker, tmp_path, step, batch,
                                                                     recovery, committed):
    w = Writer(shared_broker.bootstrap, tmp_path)
    r = w.run(failpoint=f"{step}:{batch}")
    assert r.returncode == KILLED, r.stdout + r.stderr
    assert f"failpoint {step} {batch}: kill -9" in r.stdout
    # in doubt: the database has what it committed, the log what was committed before, and the
    # batch's records sit in a transaction left open (records in the log, invisible)
    assert w.rows() == list(range(committed * BATCH))
    if step == "completed":
        w.wait_for_state("CompleteCommit")
        assert sorted(example.read_orders(w.bootstrap, w.topic)) == w.rows()
    elif step == "db-committed":   # the example's check says what is in doubt
        code, out = w.check_command()
        assert (code, out["only_in_database"], out["only_in_topic"]) == (1, list(range(20, 30)), [])
    else:
        assert w.state() == "Ongoing"
        assert sorted(example.read_orders(w.bootstrap, w.topic)) == list(range(batch * BATCH))
        assert sorted(example.read_orders(w.bootstrap, w.topic, isolation="read_uncommitted")) == \
            list(range((batch + 1) * BATCH))
    w.recover(recovery)
    w.check_agreement(committed * BATCH)
    w.finish()


def test_a_kill_9_during_complete_after_the_coordinator_took_the_commit(shared_broker, tmp_path):
    """The writer is killed -9 while its EndTxn(commit) is at the broker and the answer held."""
    w = Writer(shared_broker.bootstrap, tmp_path)
    bs = w.bootstrap
    with ThreadedFaultProxy(bs, FaultConfig(drop_api_keys=frozenset({ApiKey.END_TXN}))) as px:
        proc = w.start(failpoint="db-committed:2:stop", bootstrap=px.bootstrap,
                       config=(f"oncelog.address.map={bs}={px.bootstrap}",))
        try:
            wait_stopped(proc)
            px.hold()
            proc.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + DEADLINE_S
            while px.held < 1:
                assert proc.poll() is None and time.monotonic() < deadline, "no EndTxn answer held"
                time.sleep(0.02)
        finally:
            proc.kill()
            out = proc.communicate(timeout=30)[0]
    assert proc.returncode == KILLED, out
    assert w.rows() == list(range(3 * BATCH))
    w.recover("nothing open")   # the coordinator had the commit: it finished it alone
    w.check_agreement(3 * BATCH)
    w.finish()
    assert w.check_command() == (0, {"rows": ORDERS, "records": ORDERS, "duplicates": [], "only_in_database": [],
                                     "only_in_topic": [], "ok": True})


@pytest.mark.parametrize(("first", "recovery", "committed"), [("prepared:2", "aborted", 2),
                                                              ("db-committed:2", "committed", 3)])
def test_a_kill_9_in_recovery_after_the_transaction_was_kept(shared_broker, tmp_path, first, recovery, committed):
    """Killed, then killed again in its recovery once init_transactions kept the transaction (its
    epoch bumped): the next recovery keeps it again and decides as the database says."""
    w = Writer(shared_broker.bootstrap, tmp_path)
    assert w.run(failpoint=first).returncode == KILLED
    r = w.run("--recover-only", failpoint="recovery-kept:0")
    assert r.returncode == KILLED, r.stdout + r.stderr
    assert w.state() == "Ongoing"
    w.recover(recovery)
    w.check_agreement(committed * BATCH)
    w.finish()


def test_a_zombie_writer_cannot_commit_a_batch_its_successor_aborted(shared_broker, tmp_path):
    """Writer A stops (SIGSTOP: a paused VM, a long GC) with batch 2 prepared; writer B starts,
    recovers (aborts A's transaction: the database never committed it) and exits; A resumes. Its
    database transaction must fail: committed, it would hold rows whose records B aborted."""
    w = Writer(shared_broker.bootstrap, tmp_path)
    zombie = w.start(failpoint="prepared:2:stop")
    try:
        wait_stopped(zombie)
        w.recover("aborted")
        zombie.send_signal(signal.SIGCONT)
        out = zombie.communicate(timeout=DEADLINE_S)[0]
    finally:
        zombie.kill()
        zombie.wait()
    w.check_agreement(2 * BATCH)   # without the database's fencing: rows 0..29, records 0..19
    assert zombie.returncode == 3 and "fenced: writer epoch" in out, out
    w.finish()


def test_the_broker_killed_with_the_writer_after_the_database_committed(tmp_path):
    """Both die (a host crash): the broker restarts from its log with the transaction prepared
    (never timed out), the writer recovers and commits it."""
    b = BrokerProcess(tmp_path / "data", {"transaction.two.phase.commit.enable": "true"}).start()
    try:
        w = Writer(b.bootstrap, tmp_path)
        assert w.run(failpoint="db-committed:2").returncode == KILLED
        b.restart(clean=False)
        w.bootstrap = b.bootstrap
        assert w.state() == "Ongoing"
        w.recover("committed")
        w.check_agreement(3 * BATCH)
        w.finish()
    finally:
        b.stop()
