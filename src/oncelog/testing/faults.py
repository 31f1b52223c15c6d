"""Faults for `oncelog verify`: the proxy's network faults (reset, drop, delay) and the process
faults run one after another by a FaultRunner against a LocalCluster: kill -9 and restart (a
broker, the controller, everything), leader moves, producer-state expiry with the log start
offset moved under idle producers, a full disk under a partition directory, and the storage
faults: a broker (or the controller) restarted with a storage failpoint armed (`fsync`: EIO on an
fsync after the bytes reached the file; `shortwrite`: half a write, as on a full disk), run under
load until it fires, then restarted clean; and `power-loss`: every process killed and every
segment and metadata log cut to its last fsynced size (storage.failpoints' ledger, kept by every
process of such a run) before they restart; and client pressure (giveup): oncelog's producer gives batches up
while their outcome is unknown; and `pause` (Jepsen's nemesis of that name): SIGSTOP of a broker,
of the controller, or (transactions) of a copy-loop client process in the middle of a
transaction, for a time drawn on both sides of the timeouts that matter to the target (the
brokers' session with the controller; the group session and the transaction timeout for a
client), then SIGCONT. late-endtxn (transactions only, not part of `all`): the proxies
hold an EndTxn back past the client's request timeout and deliver it once its producer's next
transaction has written (testing.late_endtxn).

The schedule comes from a seeded random.Random: the same seed gives the same sequence of faults,
targets and pauses. Every enabled process fault fires once, in a seeded order, before the rest
are drawn at random, so that even a short run exercises each of them."""
from __future__ import annotations

import errno
import random
import resource
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from oncelog.storage.failpoints import ENV as FAILPOINTS
from oncelog.testing.cluster import LocalCluster
from oncelog.testing.embedded import SESSION_TIMEOUT_MS
from oncelog.testing.fault_proxy import FaultConfig
from oncelog.testing.power_loss import LEDGER, lose_unsynced
from oncelog.testing.workloads import end_offsets, read_range

NETWORK_FAULTS = ("reset", "drop", "delay")
STORAGE_FAULTS = ("fsync", "shortwrite", "power-loss")
PROCESS_FAULTS = ("kill", "move", "pause", "expiry", "disk") + STORAGE_FAULTS
CLIENT_FAULTS = ("giveup",)
ALL_FAULTS = NETWORK_FAULTS + PROCESS_FAULTS + CLIENT_FAULTS
# faults `all` leaves out: late-endtxn makes every Transactions V1 client fail by design
TXN_FAULTS = ("late-endtxn",)
KNOWN_FAULTS = ALL_FAULTS + TXN_FAULTS
_FAILPOINT = {"fsync": "fsync-eio", "shortwrite": "shortwrite"}

# giveup, client pressure: oncelog's producer gives batches up with their outcome unknown (one
# retry, a short delivery.timeout.ms, small batches so that several per partition are on the
# wire) while 20% of responses are dropped after the broker wrote and every response (not
# request) is slowed: when one is dropped, the requests sent after it were written too, so a
# partition loses the answers of several written batches at once, and the oldest is often given
# up when its retry is dropped as well. A producer that renumbers the others writes them twice.
GIVEUP_PRODUCER = {"delivery.timeout.ms": 1500, "request.timeout.ms": 600, "retries": 1,
                   "batch.size": 512}
GIVEUP_RESPONSE_DELAY_MS = 20
GIVEUP_DROP_PROBABILITY = 0.2

# late-endtxn: one EndTxn in five is held, its connection hanging past the copy loops' request
# timeouts (oncelog's request.timeout.ms and librdkafka's socket.timeout.ms, both 5 s)
LATE_ENDTXN_PROBABILITY = 0.2
LATE_ENDTXN_HOLD_S = 6.0

# producer-state expiry as the expiry fault runs it: short, so that a pause can outlast it
EXPIRATION_MS, EXPIRATION_CHECK_MS = 2000, 250

# pause: the timeouts a pause is drawn around. A broker or the controller: the brokers' session
# (`--session-timeout-ms` of the cluster's controller); a client: its group session (KIP-848's
# group.consumer.session.timeout.ms, librdkafka's classic session.timeout.ms: both this under the
# pause fault) and its transaction.timeout.ms (this under the pause fault)
PAUSE_GROUP_SESSION_MS = 10_000
PAUSE_TRANSACTION_TIMEOUT_MS = 15_000


def proxy_config(faults: set[str], seed: int) -> FaultConfig:
    giveup = "giveup" in faults
    latency = 3 if "delay" in faults else 0
    return FaultConfig(latency_ms_up=latency,
                       latency_ms_down=GIVEUP_RESPONSE_DELAY_MS if giveup else latency,
                       reset_probability=0.05 if "reset" in faults else 0,
                       drop_response_probability=(GIVEUP_DROP_PROBABILITY if giveup
                                                  else 0.05 if "drop" in faults else 0),
                       seed=seed,
                       late_endtxn_probability=LATE_ENDTXN_PROBABILITY if "late-endtxn" in faults else 0,
                       late_endtxn_hold_s=LATE_ENDTXN_HOLD_S)


def process_env(faults: set[str]) -> dict[str, str]:
    """Every process of a power-loss run keeps the fsync ledger from its first start."""
    return {FAILPOINTS: LEDGER} if "power-loss" in faults else {}


def client_config(faults: set[str], client: str) -> dict:
    """Producer settings a workload runs with under these faults."""
    return dict(GIVEUP_PRODUCER) if "giveup" in faults and client == "oncelog" else {}


def broker_overrides(faults: set[str]) -> dict[str, str]:
    out = {}
    if "expiry" in faults:
        out.update({"producer.id.expiration.ms": str(EXPIRATION_MS),
                    "producer.id.expiration.check.interval.ms": str(EXPIRATION_CHECK_MS)})
    if "pause" in faults:   # a paused client outlasts its group session within a run's time
        out.update({"group.consumer.min.session.timeout.ms": str(PAUSE_GROUP_SESSION_MS // 2),
                    "group.consumer.session.timeout.ms": str(PAUSE_GROUP_SESSION_MS)})
    return out


class FullDisk:
    """A partition directory on a size-limited tmpfs that `fill()` fills to the last byte (real
    ENOSPC); where mounting is not allowed, the brokers' file-size limit is lowered instead
    (RLIMIT_FSIZE: every write that grows a file fails with EFBIG, an injected write error)."""

    def __init__(self, directory: Path, cluster: LocalCluster, size_mb: int = 256) -> None:
        self.directory, self.cluster, self.size_mb = directory, cluster, size_mb
        self.mounted = False
        self._filler: Path | None = None
        self._limited: dict[int, tuple[int, int]] = {}

    @property
    def method(self) -> str:
        return "tmpfs" if self.mounted else "RLIMIT_FSIZE"

    def prepare(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs",
                            str(self.directory)], capture_output=True)
        self.mounted = r.returncode == 0

    def fill(self) -> None:
        if self.mounted:
            self._filler = self.directory / "zz-verify-filler"
            chunk = b"\0" * (1 << 20)
            with open(self._filler, "wb", buffering=0) as f:
                while True:
                    try:
                        f.write(chunk)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        if len(chunk) == 1:
                            break
                        chunk = chunk[: len(chunk) // 2]
            return
        for b in self.cluster.brokers.values():
            if b.running:
                assert b.proc is not None  # running
                pid = b.proc.pid
                self._limited[pid] = resource.prlimit(pid, resource.RLIMIT_FSIZE)
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, self._limited[pid][1]))

    def release(self) -> None:
        if self._filler is not None:
            self._filler.unlink(missing_ok=True)
            self._filler = None
        for pid, limits in self._limited.items():
            try:
                resource.prlimit(pid, resource.RLIMIT_FSIZE, limits)
            except ProcessLookupError:
                pass
        self._limited.clear()

    def close(self, keep_in: Path | None = None) -> None:
        """Unmount; `keep_in`: copy the partition's files there first (a kept work directory
        should still hold every partition for a post-mortem)."""
        self.release()
        if self.mounted and keep_in is not None:
            shutil.copytree(self.directory, keep_in / f"{self.directory.name}.from-tmpfs", dirs_exist_ok=True)
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.directory)], capture_output=True)
            self.mounted = False


@dataclass
class FaultEvent:
    at_s: float
    fault: str
    what: str
    took_s: float = 0.0

    def line(self) -> str:
        return f"{self.at_s:7.1f}s  {self.fault:<6} {self.what} ({self.took_s:.1f}s)"


class FirstRound:
    """The first round of a run's faults (each fault once) and the share of a workload's records
    that may be sent while it lasts: a workload paced by `share` keeps records for every fault
    of the round however long the faults take, so a slow machine stretches the load with the
    faults instead of ending it before the last fault had its turn. It is never held back while
    the records of the fault under way and of the next are still to send."""

    def __init__(self, faults: int) -> None:
        self.total = faults
        self.fired = 0
        self.over = threading.Event()
        if faults == 0:
            self.over.set()

    def one_fired(self) -> None:
        self.fired += 1
        if self.fired >= self.total:
            self.over.set()

    def share(self) -> float:
        # the records of the faults done, of the one under way and of the next: a fault that
        # waits for writes (the fsync and short-write failpoints count them) always has them
        return 1.0 if self.over.is_set() else min(1.0, (self.fired + 2) / (self.total + 1))


@dataclass
class FaultRunner:
    """Runs process faults one at a time until `stop()`; each fault is complete (processes
    restarted, producers resumed) before the next starts or the runner returns."""

    cluster: LocalCluster
    topic: str
    partitions: int
    faults: list[str]
    seed: int
    gate: threading.Event                 # set = workloads may send
    disk: FullDisk | None = None
    events: list[FaultEvent] = field(default_factory=list)
    archive: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)
    error: BaseException | None = None
    on_event: Callable[[FaultEvent], None] | None = None
    first_round: FirstRound | None = None
    # pause: client processes that can be stopped in the middle of a transaction (the
    # transactions workload's `txn_workloads.PausableLoop`s); none: pauses hit brokers and the controller
    pausable_clients: list = field(default_factory=list)
    # the share workload: its group, whose share-state log every other storage cycle aims at
    share_state: str = ""

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._storage_cycles = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-runner", daemon=True)
        self._t0 = time.monotonic()

    def start(self) -> FaultRunner:
        self._t0 = time.monotonic()
        if self.faults:
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 120) -> None:
        self._stop.set()
        if self.first_round is not None:
            self.first_round.over.set()   # workloads held for the round send the rest
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def plan(self):
        """(pause before, fault) forever: each fault once in a seeded order, then at random."""
        first = list(self.faults)
        self.rng.shuffle(first)
        for fault in first:
            yield self.rng.uniform(0.5, 2.0), fault
        while True:
            yield self.rng.uniform(0.5, 2.0), self.rng.choice(self.faults)

    def _run(self) -> None:
        try:
            for pause, fault in self.plan():
                if self._stop.wait(pause):
                    return
                start = time.monotonic()
                what = getattr(self, f"_{fault.replace('-', '_')}")()
                event = FaultEvent(round(start - self._t0, 1), fault, what, round(time.monotonic() - start, 1))
                self.events.append(event)
                if self.first_round is not None and len(self.events) <= len(self.faults):
                    self.first_round.one_fired()
                if self.on_event is not None:
                    self.on_event(event)
        except BaseException as e:  # noqa: BLE001 - reported by verify: a fault that cannot run is a failed run
            self.error = e
            self.gate.set()

    # ---------------------------------------------------------------- the faults

    def _kill(self) -> str:
        c, n = self.cluster, self.cluster.n
        target = self.rng.choice(["broker"] * 3 + ["controller", "all"])
        down = self.rng.uniform(0.3, 1.5)
        if target == "broker":
            i = self.rng.randint(1, n)
            c.kill_broker(i)
            time.sleep(down)
            c.start_broker(i)
            return f"kill -9 broker {i}, down {down:.1f}s"
        if target == "controller":
            c.kill_controller()
            time.sleep(down)
            c.start_controller()
            return f"kill -9 controller, down {down:.1f}s"
        c.kill_controller()
        for i in c.brokers:
            c.kill_broker(i)
        time.sleep(down)
        c.start_controller()
        for i in c.brokers:
            c.start_broker(i)
        return f"kill -9 controller and all {n} brokers, down {down:.1f}s"

    def _pause(self) -> str:
        """SIGSTOP, a drawn time, SIGCONT. A broker: below its session (nothing moves; requests
        wait in its sockets and complete), past it (its partitions, transaction coordinators and
        group coordinators move; it must change nothing once it resumes), now and then past the
        clients' group session too. The controller: below or past the session (it must not
        declare anyone dead for its own silence). A client in the middle of a transaction: below
        its group session, past it (fenced as a member), or past its transaction timeout too
        (aborted by its coordinator, then fenced when it resumes)."""
        c = self.cluster
        session = SESSION_TIMEOUT_MS / 1000
        targets = ["broker"] * 4 + ["controller"] + ["client"] * (2 if self.pausable_clients else 0)
        target = self.rng.choice(targets)
        if target == "client":
            return self._pause_client()
        r = self.rng.random()
        if target == "controller":
            held = self.rng.uniform(0.3, 0.8) * session if r < 0.5 else self.rng.uniform(1.5, 3.0) * session
            c.pause_controller()
            try:
                time.sleep(held)
            finally:
                c.resume_controller()
            return f"SIGSTOP controller for {held:.1f}s ({_side(held, session, 'session')})"
        i = self.rng.randint(1, c.n)
        if r < 0.4:
            held = self.rng.uniform(0.2, 0.8) * session
        elif r < 0.85:
            held = self.rng.uniform(1.3, 3.0) * session
        else:
            held = PAUSE_GROUP_SESSION_MS / 1000 + self.rng.uniform(0.5, 3.0)
        c.pause_broker(i)
        try:
            time.sleep(held)
        finally:
            c.resume_broker(i)
        return f"SIGSTOP broker {i} for {held:.1f}s ({_side(held, session, 'session')})"

    def _pause_client(self) -> str:
        loop = self.rng.choice(self.pausable_clients)
        group, txn = PAUSE_GROUP_SESSION_MS / 1000, PAUSE_TRANSACTION_TIMEOUT_MS / 1000
        r = self.rng.random()
        held = (self.rng.uniform(1.0, 3.0) if r < 0.4 else self.rng.uniform(group + 0.5, txn - 0.5) if r < 0.7
                else self.rng.uniform(txn + 0.5, txn + 4.0))
        where = loop.pause(held)
        sides = (loop.sides(held) if hasattr(loop, "sides")   # a client of no transaction says what it outlasted
                 else f"{_side(held, group, 'group session')}, {_side(held, txn, 'transaction timeout')}")
        return f"SIGSTOP client {loop.name} {where} for {held:.1f}s ({sides})"

    def _move(self) -> str:
        p, b = self.rng.randrange(self.partitions), self.rng.randint(1, self.cluster.n)
        code = self.cluster.move_leader(self.topic, p, b)
        return f"move {self.topic}-{p} to broker {b}" + (f": refused, error {code}" if code else "")

    def _expiry(self) -> str:
        """Idle every producer past producer.id.expiration.ms, then move the log start offset to
        the end (DeleteRecords, as retention would): their next batch meets UNKNOWN_PRODUCER_ID
        with a log start offset above everything they had acknowledged. What is deleted is read
        first and kept for the checker."""
        self.gate.clear()
        try:
            bootstrap = self.cluster.bootstrap
            self._wait_quiet(bootstrap)
            time.sleep((EXPIRATION_MS + 2 * EXPIRATION_CHECK_MS) / 1000 + 0.5)
            self.cluster.set_faults(False)
            try:
                security = getattr(self.cluster, "client_security", {})
                records, ends = read_range(bootstrap, self.topic, security=security)
                for p, recs in records.items():
                    self.archive.setdefault(p, []).extend(recs)
                moved = _delete_records(bootstrap, self.topic, ends, security)
            finally:
                self.cluster.set_faults(True)
        finally:
            self.gate.set()
        return f"producers idle {EXPIRATION_MS} ms+, log start moved to {moved}"

    def _wait_quiet(self, bootstrap: str, quiet_s: float = 1.0, timeout_s: float = 60) -> None:
        """Until no partition's end offset moved for `quiet_s` (in-flight batches are done)."""
        deadline = time.monotonic() + timeout_s
        last, since = None, time.monotonic()
        while time.monotonic() < deadline:
            try:
                now = end_offsets(bootstrap, self.topic, security=getattr(self.cluster, "client_security", {}))
            except Exception:  # noqa: BLE001 - the cluster is mid-fault; asked again until the deadline
                now = None
            if now != last:
                last, since = now, time.monotonic()
            elif now is not None and time.monotonic() - since >= quiet_s:
                return
            time.sleep(0.2)

    def _disk(self) -> str:
        assert self.disk is not None
        held = self.rng.uniform(1.0, 3.0)
        self.disk.fill()
        try:
            time.sleep(held)
        finally:
            self.disk.release()
        where = f"{self.disk.directory.name}" if self.disk.mounted else "every broker"
        return f"disk full ({self.disk.method}) under {where} for {held:.1f}s"


    def _fsync(self) -> str:
        return self._storage_cycle("fsync")

    def _shortwrite(self) -> str:
        return self._storage_cycle("shortwrite")

    def _storage_cycle(self, fault: str) -> str:
        """A broker (or, one time in four, the controller) restarted with the failpoint armed,
        under load until it fires, then killed and restarted clean (recovery runs)."""
        if self.rng.random() < 0.25:
            return self._metadata_cycle(fault)
        c, kind = self.cluster, _FAILPOINT[fault]
        i = self.rng.randint(1, c.n)
        b = c.brokers[i]
        # fsyncs: past those of opening the partitions; writes happen only for appends
        after = self.rng.randint(3, 12) if fault == "fsync" else self.rng.randint(0, 8)
        times = self.rng.randint(1, 3)
        # a share workload's run aims every other cycle at its group's share-state log instead
        target = "share" if self.share_state and self._storage_cycles % 2 == 1 else "log"
        match = self.share_state if target == "share" else f"{self.topic}-"
        rule = f"{kind}:{target}:match={match}:after={after}:times={times}"
        # every other fsync cycle fsyncs in the append path (Kafka's flush.messages=1) instead
        # of the group commit: both must leave nothing of a failed batch
        inline = fault == "fsync" and self._storage_cycles % 2 == 0
        self._storage_cycles += 1
        seen = _count(b.log_file, f"failpoint {kind}:{target} fires")
        c.kill_broker(i)
        b.env = {**c.env, FAILPOINTS: ",".join(filter(None, (rule, c.env.get(FAILPOINTS))))}
        if inline:
            b.overrides["log.flush.interval.messages"] = "1"
        c.start_broker(i)
        try:
            p = self.rng.randrange(self.partitions)
            moved = c.move_leader(self.topic, p, i)  # it leads at least one partition under load
            # 2-4 s under load, and longer (up to 30 s) while it has not fired at all: appends
            # are slow to come when the faults before it (a long pause, say) held the producers up
            start = time.monotonic()
            deadline, latest = start + self.rng.uniform(2.0, 4.0), start + 30.0
            while True:
                fired_now = _count(b.log_file, f"failpoint {kind}:{target} fires") - seen
                now = time.monotonic()
                if fired_now >= times or now >= latest or (now >= deadline and fired_now > 0):
                    break
                time.sleep(0.1)
        finally:
            c.kill_broker(i)
            b.env = dict(c.env)
            b.overrides.pop("log.flush.interval.messages", None)
            c.start_broker(i)
        fired = _count(b.log_file, f"failpoint {kind}:{target} fires") - seen
        return (f"{rule} on broker {i}{' (fsync in the append path)' if inline else ''}, leading "
                f"{self.topic}-{p}{'' if not moved else f' (move refused: {moved})'}: fired {fired}x, "
                "restarted clean")

    def _metadata_cycle(self, fault: str) -> str:
        """The controller restarted with the failpoint on its metadata log; two leader moves
        (metadata writes) meet it: the first is refused (KAFKA_STORAGE_ERROR) and nothing of it
        is kept, the next one works."""
        c, kind = self.cluster, _FAILPOINT[fault]
        rule = f"{kind}:metadata:times=1"
        seen = _count(c.controller.log_file, f"failpoint {kind}:metadata fires")
        c.kill_controller()
        c.controller.env = {**c.env, FAILPOINTS: ",".join(filter(None, (rule, c.env.get(FAILPOINTS))))}
        c.start_controller()
        p = self.rng.randrange(self.partitions)
        try:
            codes = [self._move_when_live(p, b) for b in (1, c.n, 1)]
        finally:
            c.kill_controller()
            c.controller.env = dict(c.env)
            c.start_controller()
        fired = _count(c.controller.log_file, f"failpoint {kind}:metadata fires") - seen
        return f"{rule} on the controller: moves of {self.topic}-{p} answered {codes}, fired {fired}x"

    def _move_when_live(self, partition: int, broker: int, timeout_s: float = 10) -> int:
        """A restarted controller knows a broker as live only from its next heartbeat."""
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.cluster.move_leader(self.topic, partition, broker)
            if code != 8 or time.monotonic() > deadline:  # BROKER_NOT_AVAILABLE
                return code
            time.sleep(0.2)

    def _power_loss(self) -> str:
        """Every process killed at once, then what no fsync covered is lost, then all restart.
        Every other time the cut strikes a broker about to fsync: it is restarted with a crash
        failpoint (SIGKILL right before an fsync, the appends it would cover only in the page
        cache), and the others are killed when it dies."""
        c = self.cluster
        during = ""
        if self._storage_cycles % 2 == 0:
            i = self.rng.randint(1, c.n)
            b = c.brokers[i]
            rule = f"crash:log:at=fsync:match={self.topic}-:after={self.rng.randint(4, 20)}"
            c.kill_broker(i)
            b.env = {**c.env, FAILPOINTS: ",".join(filter(None, (rule, c.env.get(FAILPOINTS))))}
            c.start_broker(i)
            c.move_leader(self.topic, self.rng.randrange(self.partitions), i)
            deadline = time.monotonic() + 5
            while b.running and time.monotonic() < deadline:
                time.sleep(0.05)
            during = f" ({rule} on broker {i}: {'it died at the failpoint' if not b.running else 'it never fired'})"
            b.env = dict(c.env)
        self._storage_cycles += 1
        c.kill_controller()
        for i in c.brokers:
            c.kill_broker(i)
        cuts = lose_unsynced(c.root)
        down = self.rng.uniform(0.3, 1.0)
        time.sleep(down)
        c.start_controller()
        for i in c.brokers:
            c.start_broker(i)
        return (f"power loss{during}: controller and {c.n} brokers killed, {len(cuts)} files cut to their "
                f"last fsync ({sum(cut.lost for cut in cuts)} bytes lost), down {down:.1f}s")


def _side(held_s: float, timeout_s: float, what: str) -> str:
    return f"{'past' if held_s > timeout_s else 'within'} the {what} of {timeout_s:.0f}s"


def _count(path, text: str) -> int:
    try:
        with open(path, errors="replace") as f:
            return f.read().count(text)
    except (FileNotFoundError, TypeError):
        return 0


def _delete_records(bootstrap: str, topic: str, ends: dict[int, int], security: dict | None = None
                    ) -> dict[int, int]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap, **(security or {}), "log_level": 3})
    futures = admin.delete_records([TopicPartition(topic, p, off) for p, off in ends.items() if off > 0])
    moved = {}
    for tp, fut in futures.items():
        moved[tp.partition] = fut.result(30).low_watermark
    return dict(sorted(moved.items()))

