"""`oncelog verify --workload share`: members of one share group (KIP-932), oncelog's and
confluent-kafka's `ShareConsumer`s, each in a process of its own (`testing.share_child`), read a
topic that oncelog's idempotent producer fills at a pace while the faults run; then the group is
drained, the share-partitions' final state is read from the store, and the checker
(`testing.share_checker`) judges what every member was given and acknowledged.

Members, per client: one that accepts, one that releases, rejects and accepts ("mixed"), and one
that holds what it acquired for a while and is killed -9 (then started again) every few seconds,
its records acquired. Every member releases the "poison" records (one in 40) at every delivery,
so those are archived at the delivery count limit. The pause fault stops members too (SIGSTOP,
within or past the record lock and the share session).

A share-partition lives on the broker that coordinates its group and leads the partition
(docs/share-groups.md, "Not served yet"): the topic's partitions and the group's
`__consumer_offsets` partition are placed on one broker at the start and always move together
(`LocalCluster.colocated`: the move fault and the storage faults' moves); a broker killed or
paused past its session hands all of them to the other broker. The storage faults aim every other
cycle at the group's share-state log instead of the topic's segments.

`--share-dlq` gives the group a dead-letter topic (KIP-1191: `share.version` 2, the topic
`dlq.verify-sharers` with `errors.deadletterqueue.group.enable`, the group's
`errors.deadletterqueue.topic.name` and `copy.record.enable`), placed and moved with the others; the
run waits for the brokers to owe no dead letters, reads the topic back, and the checker wants one
dead-letter record per record that ended rejected or at the delivery limit (`dlq-*` anomalies)."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from oncelog.core.txn.log_format import CONSUMER_OFFSETS_TOPIC, partition_for
from oncelog.testing.embedded import close_stdin_and_wait
from oncelog.testing.fault_run import FaultRun, FaultRunResult
from oncelog.testing.faults import (
    CLIENT_FAULTS,
    NETWORK_FAULTS,
    PAUSE_GROUP_SESSION_MS,
    broker_overrides,
)
from oncelog.testing.share_checker import DeadLetterRecord, History, ShareReport, check_share
from oncelog.testing.workloads import OncelogWorkload, end_offsets, read_range

SHARE_CLIENTS = ("oncelog", "librdkafka")
TOPIC, GROUP = "verify-share", "verify-sharers"
DLQ_TOPIC = "dlq." + GROUP          # the group's dead-letter topic with --share-dlq (the cluster's prefix)
OFFSETS_PARTITIONS = 50          # offsets.topic.num.partitions, set for the run
LOCK_MS = 4000                   # group.share.record.lock.duration.ms: a pause is drawn on both sides of it
DELIVERY_LIMIT = 5               # group.share.delivery.count.limit
CRASH_EVERY_S = (3.0, 8.0)       # a crashing member is killed -9 after this long (drawn)
HOLD_S = 1.5                     # ... and holds what it acquired this long before acknowledging

_BROKER_COUNTERS = {
    "oncelog_requests_total{api=ShareFetch}": "ShareFetch requests",
    "oncelog_requests_total{api=ShareAcknowledge}": "ShareAcknowledge requests",
    "oncelog_request_errors_total{api=ShareFetch,error=NOT_LEADER_OR_FOLLOWER}": "share_fetch NOT_LEADER_OR_FOLLOWER",
    "oncelog_request_errors_total{api=ShareFetch,error=INVALID_SHARE_SESSION_EPOCH}":
        "share_fetch INVALID_SHARE_SESSION_EPOCH",
    "oncelog_request_errors_total{api=ShareFetch,error=SHARE_SESSION_NOT_FOUND}": "share_fetch SHARE_SESSION_NOT_FOUND",
    "oncelog_request_errors_total{api=ShareFetch,error=KAFKA_STORAGE_ERROR}": "share_fetch KAFKA_STORAGE_ERROR",
    "oncelog_request_errors_total{api=ShareAcknowledge,error=INVALID_RECORD_STATE}":
        "share_acknowledge INVALID_RECORD_STATE",
    "oncelog_request_errors_total{api=ShareGroupHeartbeat,error=UNKNOWN_MEMBER_ID}":
        "share_group_heartbeat UNKNOWN_MEMBER_ID",
    "oncelog_share_records_total{event=lock_expiries}": "share records: lock expiries",
    "oncelog_share_records_total{event=archived_by_limit}": "share records: archived by the limit",
    "oncelog_share_records_total{event=redelivered}": "share records: redelivered",
    "oncelog_share_records_total{event=dead_lettered}": "share records: dead-lettered",
    "oncelog_share_records_total{event=dead_letter_failed}": "share records: archived without a dead-letter record",
}


@dataclass
class ShareVerifyResult(FaultRunResult):
    report: ShareReport
    history: History = field(default_factory=History)

    @property
    def ok(self) -> bool:
        return self.report.ok and self.harness_ok

    def to_json(self) -> dict:
        return {"ok": self.ok, "workload": "share", **self.common_json(), "report": self.report.to_json()}


class Member:
    """One slot of the group: a `share_child` process, started again after each kill -9 (each
    incarnation a new member id and events file). `pause` is the pause fault's (SIGSTOP)."""

    def __init__(self, root: Path, bootstrap: str, security: dict, slot: str, client: str, policy: str,
                 seed: int, hold_s: float = 0.0, crashes: bool = False) -> None:
        self.root, self.bootstrap, self.security = root, bootstrap, security
        self.slot, self.client, self.policy, self.seed = slot, client, policy, seed
        self.hold_s, self.crashes = hold_s, crashes
        self.name = slot
        self.files: list[Path] = []
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.stats: Counter = Counter()
        self.stopping = threading.Event()
        self._crasher: threading.Thread | None = None

    def start(self) -> Member:
        with self.lock:
            self._spawn()
        if self.crashes:
            self._crasher = threading.Thread(target=self._crash_loop, name=f"crash-{self.slot}", daemon=True)
            self._crasher.start()
        return self

    def _spawn(self) -> None:
        k = len(self.files) + 1
        events = self.root / f"{self.slot}#{k}.jsonl"
        self.files.append(events)
        spec = {"bootstrap": self.bootstrap, "security": self.security, "group": GROUP, "topic": TOPIC,
                "client": self.client, "policy": self.policy, "seed": self.seed, "hold_s": self.hold_s,
                "name": f"{self.slot}#{k}", "events": str(events)}
        self.proc = subprocess.Popen([sys.executable, "-m", "oncelog.testing.share_child", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=open(self.root / f"{self.slot}#{k}.stderr", "wb"))
        self.name = f"{self.slot}#{k} (pid {self.proc.pid})"

    def _crash_loop(self) -> None:
        rng = random.Random(f"{self.seed}/{self.slot}")
        while not self.stopping.wait(rng.uniform(*CRASH_EVERY_S)):
            with self.lock:
                if self.stopping.is_set() or self.proc is None:
                    return
                self.proc.kill()          # kill -9, with what it acquired (it holds records HOLD_S of each loop)
                self.proc.wait(10)
                self.stats["killed -9"] += 1
                self._spawn()

    def pause(self, held_s: float) -> str:
        with self.lock:
            proc = self.proc
            assert proc is not None  # started
            proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(held_s)
            finally:
                proc.send_signal(signal.SIGCONT)
        self.stats["paused"] += 1
        return f"(a {self.client} share consumer, {self.policy})"

    def sides(self, held_s: float) -> str:
        def side(limit_ms: int, what: str) -> str:
            return f"{'past' if held_s * 1000 > limit_ms else 'within'} the {what} of {limit_ms / 1000:.0f}s"
        return f"{side(LOCK_MS, 'record lock')}, {side(PAUSE_GROUP_SESSION_MS, 'share session')}"

    def restart_if_dead(self, notes: list[str]) -> None:
        """A member that exited on its own is a client finding: noted, started again."""
        with self.lock:
            if self.proc is not None and self.proc.poll() is not None and not self.stopping.is_set():
                notes.append(f"{self.name} exited by itself (code {self.proc.returncode}); started again")
                self.stats["exited"] += 1
                self._spawn()

    def stop(self, notes: list[str], timeout_s: float = 30) -> None:
        """Its standard input closed: it closes its consumer (what it holds goes back) and exits."""
        self.stopping.set()
        if self._crasher is not None:
            self._crasher.join(15)
        with self.lock:
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return
            if not close_stdin_and_wait(proc, timeout_s):
                notes.append(f"{self.name} did not close within {timeout_s:.0f}s; killed")

    def events(self) -> list[tuple[str, list]]:
        out = []
        for f in self.files:
            out.append((f.stem, read_events(f)))
        return out


def read_events(path: Path) -> list[list]:
    events: list[list] = []
    try:
        data = path.read_text(errors="replace")
    except FileNotFoundError:
        return events
    for line in data.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass   # a line cut by kill -9
    return events


def _got(members: list[Member]) -> int:
    return sum(f.read_bytes().count(b'["got"') for m in members for f in m.files if f.exists())


def _wait_quiet(members: list[Member], quiet_s: float, timeout_s: float, notes: list[str], what: str) -> None:
    """Until no member got a record for `quiet_s` (members that die are started again)."""
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        for m in members:
            m.restart_if_dead(notes)
        n = _got(members)
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.5)
    notes.append(f"{what}: records still came after {timeout_s:.0f}s")


def _place(fault_run: FaultRun, partitions: int, say, topics: tuple[str, ...] = (TOPIC,)) -> None:
    """The topics' partitions and the group's `__consumer_offsets` partition on broker 1, moving
    together from now on."""
    from oncelog.protocol.api import ApiKey
    from oncelog.protocol.errors import ErrorCode
    from oncelog.testing.raw_client import RawConnection
    cluster = fault_run.cluster
    address = cluster.brokers[1].bootstrap

    def coordinator() -> int:
        with RawConnection(address, timeout_s=30) as raw:
            c = raw.call(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=(GROUP,)).coordinators[0]
            return int(c.node_id) if c.error_code.value == ErrorCode.NONE else -1

    deadline = time.monotonic() + 60
    while coordinator() < 0:   # the first FindCoordinator creates __consumer_offsets
        if time.monotonic() > deadline:
            raise TimeoutError(f"no coordinator for {GROUP}")
        time.sleep(0.2)
    offsets = (CONSUMER_OFFSETS_TOPIC, partition_for(GROUP, OFFSETS_PARTITIONS))
    cluster.colocated = [offsets] + [(t, p) for t in topics for p in range(partitions)]
    say(f"placing {', '.join(topics)}'s {partitions} partitions and {offsets[0]}-{offsets[1]} ({GROUP}'s) on broker 1")
    for t in topics:
        cluster.place(t, dict.fromkeys(range(partitions), 1))
    while coordinator() != 1:
        if time.monotonic() > deadline:
            raise TimeoutError(f"broker 1 never coordinated {GROUP}")
        time.sleep(0.2)


def _group_configs(cluster, dlq: bool = False) -> None:
    """share.auto.offset.reset=earliest (IncrementalAlterConfigs on the GROUP resource), sent to
    broker 1, the group's coordinator: another broker answers UNKNOWN_SERVER_ERROR (it cannot
    write the group's configs without the group's lease), and librdkafka's admin client sends it
    to any broker. `dlq`: share.version 2 first (UpdateFeatures, which the controller takes), and
    the group's dead-letter topic, its records copied."""
    from oncelog.protocol import entities
    from oncelog.protocol.api import ApiKey
    from oncelog.protocol.errors import ErrorCode
    from oncelog.testing.raw_client import RawConnection
    configs = {"share.auto.offset.reset": "earliest"}
    if dlq:
        configs.update({"errors.deadletterqueue.topic.name": DLQ_TOPIC,
                        "errors.deadletterqueue.copy.record.enable": "true"})
    with RawConnection(cluster.brokers[1].bootstrap, timeout_s=30) as raw:
        if dlq:
            mod = entities.module(ApiKey.UPDATE_FEATURES, 1, "request")
            u = raw.call(ApiKey.UPDATE_FEATURES, 1, timeout=30000, validate_only=False, feature_updates=(
                entities.make(mod.FeatureUpdateKey, feature="share.version", max_version_level=2, upgrade_type=1),))
            if int(u.error_code) != ErrorCode.NONE:
                raise RuntimeError(f"share.version=2: {u}")
        set_group_configs(raw, GROUP, configs)


def set_group_configs(raw, group: str, configs: dict[str, str]) -> None:
    """A group's configs set (IncrementalAlterConfigs SET on the GROUP resource) through the raw
    connection `raw` (`testing.raw_client.RawConnection`); raises if they are refused."""
    from oncelog.protocol import entities
    from oncelog.protocol.api import ApiKey
    from oncelog.protocol.errors import ErrorCode
    api = ApiKey.INCREMENTAL_ALTER_CONFIGS
    res = entities.nested(api, 1, "request", "AlterConfigsResource")
    cfg = entities.nested(api, 1, "request", "AlterableConfig")
    r = raw.call(api, 1, validate_only=False, resources=(res(resource_type=32, resource_name=group, configs=tuple(
        cfg(name=k, config_operation=0, value=v) for k, v in configs.items())),))
    if r.responses[0].error_code.value != ErrorCode.NONE:
        raise RuntimeError(f"setting {group}'s configs: {r.responses[0]}")


def _create_dlq_topic(fault_run: FaultRun) -> None:
    """The group's dead-letter topic, its administrator's consent given."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": fault_run.bootstrap, **fault_run.security, "log_level": 3})
    admin.create_topics([NewTopic(DLQ_TOPIC, fault_run.options.partitions, 1,
                                  config={"errors.deadletterqueue.group.enable": "true"})])[DLQ_TOPIC].result(30)


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def _dead_letters_pending(cluster) -> int:
    """Dead letters the running brokers still owe (their `oncelog_share_dead_letters_pending`);
    -1 if a broker did not answer."""
    import urllib.request
    total = 0
    for i, b in cluster.brokers.items():
        if not b.running:
            continue
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_ports[i]}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return -1
        for line in text.splitlines():
            if line.startswith("oncelog_share_dead_letters_pending "):
                total += int(float(line.split()[1]))
    return total


def _wait_no_dead_letters_owed(cluster, timeout_s: float, notes: list[str]) -> None:
    deadline = time.monotonic() + timeout_s
    while (owed := _dead_letters_pending(cluster)) != 0:
        if time.monotonic() > deadline:
            notes.append(f"the brokers still owed {owed} dead letters after {timeout_s:.0f}s")
            return
        time.sleep(0.2)


def _read_dead_letters(bootstrap: str, security: dict, timeout_s: float) -> list[DeadLetterRecord]:
    """Every record of the dead-letter topic, with its headers."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    marks = end_offsets(bootstrap, DLQ_TOPIC, security=security)
    todo = {p for p, (lo, hi) in marks.items() if hi > lo}
    out: list[DeadLetterRecord] = []
    c = Consumer({"bootstrap.servers": bootstrap, **security, "group.id": "oncelog-verify-dlq", "log_level": 3,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(DLQ_TOPIC, p, marks[p][0]) for p in todo])
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                p, offset, err = m.partition(), m.offset(), m.error()
                if p is None:
                    continue
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    if offset is not None and offset >= marks[p][1]:
                        todo.discard(p)
                    continue
                if err or offset is None or p not in todo or offset >= marks[p][1]:
                    continue
                raw = m.headers() or []
                pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
                h = {str(k): v.decode(errors="replace") if isinstance(v, bytes) else str(v or "") for k, v in pairs}
                out.append(DeadLetterRecord(p, offset, h.get("__dlq.errors.topic", ""),
                                            int(h.get("__dlq.errors.partition", -1)),
                                            int(h.get("__dlq.errors.offset", -1)), h.get("__dlq.errors.group", ""),
                                            int(h.get("__dlq.errors.delivery.count", -1)),
                                            h.get("__dlq.errors.message", ""), _bytes(m.value())))
                if offset + 1 >= marks[p][1]:
                    todo.discard(p)
        if todo:
            raise TimeoutError(f"could not read partitions {sorted(todo)} of {DLQ_TOPIC} to their end")
        return out
    finally:
        c.close()


def _final_state(data: Path) -> dict[int, tuple[int, list[tuple[int, int, int, int]]]]:
    """partition -> (start offset, state batches), from the group's share-state log (read with the
    brokers stopped: a clean stop writes what changed last)."""
    from oncelog.storage.share_state import LOG_NAME, GroupStateLog
    out: dict[int, tuple[int, list[tuple[int, int, int, int]]]] = {}
    for path in data.rglob(f"share-state/{GROUP}/{LOG_NAME}"):
        for (_topic_id, p), state in GroupStateLog.read(path).states.items():
            out[p] = (state.start_offset, [(b.first_offset, b.last_offset, b.state, b.delivery_count)
                                           for b in state.batches])
    return out


def run_share(options, progress=None) -> ShareVerifyResult:
    say = progress or (lambda _msg: None)
    faults = set(options.faults)
    overrides = {**broker_overrides(faults), "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
                 "group.share.heartbeat.interval.ms": "500",
                 "group.share.session.timeout.ms": str(PAUSE_GROUP_SESSION_MS),
                 "group.share.record.lock.duration.ms": str(LOCK_MS),
                 "group.share.delivery.count.limit": str(DELIVERY_LIMIT)}
    with FaultRun(options, TOPIC, overrides, set(NETWORK_FAULTS + CLIENT_FAULTS), say) as fault_run:
        notes, security = fault_run.notes, fault_run.security
        if "late-endtxn" in faults:
            notes.append("late-endtxn is a fault of the transactions workload; not applied to share groups")
        if "giveup" in faults:
            # its producer settings gave up 80% of the records at once, and the run's load ended
            # before the faults had their round (seed 1: kill and pause never fired)
            notes.append("giveup: the proxies' part only (responses dropped after the broker wrote, and slowed); "
                         "the producer that fills the topic keeps its own settings")
        fault_run.create_topic(TOPIC)
        dlq = options.share_dlq
        if dlq:
            _create_dlq_topic(fault_run)
        _place(fault_run, options.partitions, say, (TOPIC, DLQ_TOPIC) if dlq else (TOPIC,))
        _group_configs(fault_run.cluster, dlq)
        events_dir = fault_run.root / "share-events"
        events_dir.mkdir(exist_ok=True)
        members = []
        for k, client in enumerate(options.clients):
            seed = options.seed * 100 + k
            members += [Member(events_dir, fault_run.bootstrap, security, f"{client}-accept", client, "accept", seed),
                        Member(events_dir, fault_run.bootstrap, security, f"{client}-mixed", client, "mixed", seed),
                        Member(events_dir, fault_run.bootstrap, security, f"{client}-crash", client, "accept",
                               seed, hold_s=HOLD_S, crashes=True)]
        duration = options.duration()
        producer = OncelogWorkload(fault_run.bootstrap, TOPIC, options.records, "share",
                                   rate=options.records / duration if duration else None, gate=fault_run.gate,
                                   share=fault_run.first_round.share, timeout_s=options.timeout_s,
                                   config={"batch.size": 2048},
                                   security=security)
        say(f"{len(members)} share-group members ({', '.join(m.slot for m in members)}) read {options.records} "
            f"records under {', '.join(options.faults) or 'no faults'}")
        for m in members:
            m.start()

        def produce() -> None:
            try:
                producer.run()
            except Exception as e:  # noqa: BLE001 - what was written is what the members must finish
                notes.append(f"the producer crashed: {type(e).__name__}: {e}"[:300])
        thread = threading.Thread(target=produce, name="share-producer", daemon=True)
        # the members keep the load on until every fault had its turn (the faults stop when the
        # threads end), however soon the producer is done
        round_over = threading.Thread(target=fault_run.first_round.over.wait, args=(options.timeout_s,),
                                      name="share-round", daemon=True)
        fault_run.under_faults([thread, round_over], grace_s=60, pausable_clients=members, share_state=GROUP)
        say("faults over: the members finish what is left")
        _wait_quiet(members, LOCK_MS / 1000 + 4, options.timeout_s, notes, "draining")
        for m in members:
            m.stop(notes)
        say("a last member accepts whatever is still available")
        sweeper = Member(events_dir, fault_run.bootstrap, security, "sweeper", "oncelog", "sweep", 0).start()
        _wait_quiet([sweeper], LOCK_MS / 1000 + 3, options.timeout_s, notes, "the sweeper")
        sweeper.stop(notes)
        members.append(sweeper)

        dead_letters = None
        if dlq:
            say("waiting until the brokers owe no dead letters, then reading the dead-letter topic back")
            _wait_no_dead_letters_owed(fault_run.cluster, options.timeout_s, notes)
            dead_letters = _read_dead_letters(fault_run.bootstrap, security, options.timeout_s)
        say("reading the topic back and the share-partitions' final state")
        log, _ = read_range(fault_run.bootstrap, TOPIC, timeout_s=options.timeout_s, security=security)
        log = fault_run.with_archive(log)
        starts = {p: lo for p, (lo, _hi) in end_offsets(fault_run.bootstrap, TOPIC, security=security).items()}
        broker = fault_run.broker_answers(_BROKER_COUNTERS)
        cluster = fault_run.cluster
        for i, b in cluster.brokers.items():   # a clean stop writes every share-partition's last state
            cluster._bank_metrics(i)
            b.stop()
        final = _final_state(cluster.data)
        history = History()
        for m in members:
            for name, events in m.events():
                history.add_events(name, m.client, events)
        runner = fault_run.runner
        t0 = runner._t0 if runner is not None else 0.0
        windows = [(t0 + e.at_s, t0 + e.at_s + e.took_s) for e in fault_run.fired
                   if not e.what.startswith("SIGSTOP client")]
        archived = bool(runner is not None and runner.archive)
        report = check_share(log, history, final, DELIVERY_LIMIT, LOCK_MS / 1000, windows,
                             deleted=starts if archived else None, dead_letters=dead_letters, topic=TOPIC,
                             group=GROUP)
        clients = {}
        for m in members:
            if m.slot == "sweeper":
                continue
            mine = [d for d in history.deliveries if d.member.startswith(m.slot + "#")]
            acks = [a for a in history.acks if a.member.startswith(m.slot + "#")]
            clients[m.slot] = {"given": len(mine), "accepted": sum(a.kind == 1 for a in acks),
                               "released": sum(a.kind == 2 for a in acks), "rejected": sum(a.kind == 3 for a in acks),
                               "unknown outcome": sum(not a.confirmed for a in acks),
                               "incarnations": len(m.files), **m.stats}
        clients["sweeper"] = {"given": sum(d.member.startswith("sweeper#") for d in history.deliveries)}
        errors: dict[str, dict[str, int]] = {m.slot: {} for m in members}
        for (slot, text), n in history.errors.items():
            errors.setdefault(slot, {})[text] = n
        producer_errors = Counter((e.error or "?")[:100] for e in producer.events if e.kind in ("error", "fatal"))
        clients["producer"] = {"sent": sum(e.kind == "send" for e in producer.events),
                               "acknowledged": sum(e.kind == "ack" for e in producer.events)}
        errors["producer"] = dict(producer_errors)
        return ShareVerifyResult(options=options, report=report, faults=fault_run.fired,
                                 proxy=dict(cluster.proxy_stats()), clients=clients, client_errors=errors,
                                 broker=broker, seconds=fault_run.seconds(), notes=notes, history=history)


def render_share(result: ShareVerifyResult) -> str:
    o, r = result.options, result.report
    lines = [f"oncelog verify --workload share{' --share-dlq' if o.share_dlq else ''}: seed {o.seed}, "
             f"{o.security_protocol}, faults "
             f"{','.join(o.faults) or '-'}, clients {','.join(o.clients)}, {o.records} records, {o.brokers} brokers, "
             f"{o.partitions} partitions, {result.seconds:.0f}s", "",
             f"records in the log {r.records}, delivered {r.figures.get('delivered', 0)} "
             f"({r.deliveries} deliveries, {r.figures.get('redelivered', 0)} of them redeliveries)"]
    lines += result.activity_lines("members (what they were given and did; errors they met):")
    lines.append("figures: " + ", ".join(f"{k} {v}" for k, v in sorted(r.figures.items())
                                         if k not in ("delivered", "redelivered")))
    if r.ok:
        lines.append("OK: every record finished (acknowledged, or archived by a reject or the delivery limit), "
                     "none delivered again after a confirmed ACCEPT or REJECT, none acknowledged twice, none past "
                     "the delivery limit, delivery counts always growing, none given to a second member while "
                     "the first one's lock was valid, no member polling without a record for long while the "
                     "others were given records, none asking again without backing off"
                     + ("; one dead-letter record for each record rejected or archived at the limit, none for "
                        "any other" if o.share_dlq else ""))
    for kind, n in sorted(r.counts().items()):
        lines.append(f"ANOMALY {kind}: {n}")
    shown: Counter[str] = Counter()
    for f in r.findings:
        shown[f.kind] += 1
        if shown[f.kind] > 3:
            continue
        where = "" if f.partition < 0 else f" {TOPIC}-{f.partition}@{f.offset}"   # (starved: a member's)
        lines.append(f"  {f.kind}{where}: {f.detail}")
        lines += [f"      {h}" for h in f.history[:8]]
    return "\n".join(lines)

