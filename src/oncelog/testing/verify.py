"""`oncelog verify`: a cluster on this machine behind fault proxies, producers of several clients
writing unique values while faults run, then every partition read from its start and checked.

The result holds the checker's report, the faults that fired, what the clients said recovery cost
(retries, epoch bumps, sequence resets) and what the brokers answered (error codes, duplicates),
so that a run shows both that nothing was lost and that the faults really bit."""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from oncelog.testing.checker import Event, Report, check
from oncelog.testing.cluster import LocalCluster
from oncelog.testing.faults import (
    ALL_FAULTS,
    CLIENT_FAULTS,
    KNOWN_FAULTS,
    NETWORK_FAULTS,
    PROCESS_FAULTS,
    FaultEvent,
    FaultRunner,
    FullDisk,
    broker_overrides,
    client_config,
    process_env,
    proxy_config,
)
from oncelog.testing.workloads import WORKLOADS, Workload, read_range

CLIENTS = tuple(WORKLOADS)
WORKLOAD_KINDS = ("produce", "transactions")


@dataclass
class VerifyOptions:
    faults: tuple[str, ...] = ALL_FAULTS
    records: int = 10_000
    clients: tuple[str, ...] = CLIENTS
    seed: int = 0
    partitions: int = 4
    brokers: int = 2
    duration_s: float | None = None   # spread the records over this long; default from the faults
    workdir: Path | None = None       # kept when given; a temporary directory otherwise
    timeout_s: float = 180
    security_protocol: str = "PLAINTEXT"   # or SASL_SSL: TLS + SCRAM-SHA-512 on every broker, through the proxies
    workload: str = "produce"         # or "transactions": copy loops (testing.txn_verify)

    def __post_init__(self) -> None:
        if self.workload not in WORKLOAD_KINDS:
            raise ValueError(f"unknown workload {self.workload!r}; choose from {', '.join(WORKLOAD_KINDS)}")
        if self.workload == "transactions":
            from oncelog.testing.txn_verify import TXN_CLIENTS
            if set(self.clients) - set(TXN_CLIENTS):
                raise ValueError(f"the transactions workload runs {', '.join(TXN_CLIENTS)}, not "
                                 f"{', '.join(sorted(set(self.clients) - set(TXN_CLIENTS)))}")
        unknown = set(self.faults) - set(KNOWN_FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; choose from {', '.join(KNOWN_FAULTS)}")
        if "late-endtxn" in self.faults and self.security_protocol != "PLAINTEXT":
            raise ValueError("late-endtxn needs PLAINTEXT: the proxies cannot tell an EndTxn inside TLS")
        unknown = set(self.clients) - set(CLIENTS)
        if unknown:
            raise ValueError(f"unknown clients {sorted(unknown)}; choose from {', '.join(CLIENTS)}")
        if self.security_protocol not in ("PLAINTEXT", "SASL_SSL"):
            raise ValueError(f"security protocol {self.security_protocol}: PLAINTEXT or SASL_SSL")
        if "move" in self.faults and self.brokers < 2:
            raise ValueError("the move fault needs at least 2 brokers")

    def duration(self) -> float | None:
        if self.duration_s is not None:
            return self.duration_s or None
        # paced, so that there are many requests for the network faults to hit, and still some for
        # the last process faults (a pause takes up to 13 s of the schedule: twice the share)
        shares = sum(f in PROCESS_FAULTS for f in self.faults) + ("pause" in self.faults)
        return max(10.0, 8.0 * shares)


@dataclass
class VerifyResult:
    options: VerifyOptions
    report: Report
    faults: list[FaultEvent]
    proxy: dict[str, int]
    clients: dict[str, dict[str, int]]
    broker: dict[str, int]
    seconds: float
    notes: list[str] = field(default_factory=list)
    client_errors: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.report.broker_ok and not any(n.startswith("HARNESS") for n in self.notes)

    def to_json(self) -> dict:
        o = self.options
        return {"ok": self.ok, "seed": o.seed, "security_protocol": o.security_protocol,
                "faults": list(o.faults), "clients": list(o.clients),
                "records": o.records, "seconds": round(self.seconds, 1),
                "fault_counts": dict(Counter(e.fault for e in self.faults)),
                "fault_events": [e.__dict__ for e in self.faults], "proxy": self.proxy,
                "client_stats": self.clients, "client_errors": self.client_errors,
                "broker_answers": self.broker, "notes": self.notes,
                "report": self.report.to_json()}


# broker counters worth showing, and the names they get in the report
_BROKER_COUNTERS = {
    "oncelog_request_errors_total{api=produce,error=OUT_OF_ORDER_SEQUENCE_NUMBER}":
        "produce OUT_OF_ORDER_SEQUENCE_NUMBER",
    "oncelog_request_errors_total{api=produce,error=UNKNOWN_PRODUCER_ID}": "produce UNKNOWN_PRODUCER_ID",
    "oncelog_request_errors_total{api=produce,error=DUPLICATE_SEQUENCE_NUMBER}": "produce DUPLICATE_SEQUENCE_NUMBER",
    "oncelog_request_errors_total{api=produce,error=INVALID_PRODUCER_EPOCH}": "produce INVALID_PRODUCER_EPOCH",
    "oncelog_request_errors_total{api=produce,error=NOT_LEADER_OR_FOLLOWER}": "produce NOT_LEADER_OR_FOLLOWER",
    "oncelog_request_errors_total{api=produce,error=KAFKA_STORAGE_ERROR}": "produce KAFKA_STORAGE_ERROR",
    "oncelog_request_errors_total{api=produce,error=REQUEST_TIMED_OUT}": "produce REQUEST_TIMED_OUT",
    "oncelog_request_errors_total{api=init_producer_id,error=COORDINATOR_LOAD_IN_PROGRESS}":
        "init_producer_id COORDINATOR_LOAD_IN_PROGRESS",
    "oncelog_requests_total{api=init_producer_id}": "init_producer_id requests",
    "oncelog_producer_state_duplicates_total{kind=window}": "duplicates answered from the window",
    "oncelog_producer_state_duplicates_total{kind=tail}": "duplicates answered from the log tail",
    "oncelog_producer_state_expirations_total": "producer states expired",
    "oncelog_producer_state_restored_total": "expired producers restored from the log",
}


def run(options: VerifyOptions, progress=None):
    """Runs one verification; `progress(message)` is called as phases start. A VerifyResult, or
    for the transactions workload a `txn_verify.TxnVerifyResult`."""
    if options.workload == "transactions":
        from oncelog.testing.txn_verify import run_transactions
        return run_transactions(options, progress)
    say = progress or (lambda _msg: None)
    faults = set(options.faults)
    own_dir = options.workdir is None
    root = Path(tempfile.mkdtemp(prefix="oncelog-verify-")) if options.workdir is None else Path(options.workdir)
    topic = "verify"
    cluster = LocalCluster(root, options.brokers, broker_overrides(faults),
                           proxy_config(faults & set(NETWORK_FAULTS + CLIENT_FAULTS), options.seed),
                           env=process_env(faults), security_protocol=options.security_protocol)
    disk = FullDisk(cluster.data / f"{topic}-0", cluster) if "disk" in faults else None
    gate = threading.Event()
    gate.set()
    notes: list[str] = []
    if "late-endtxn" in faults:
        notes.append("late-endtxn is a fault of the transactions workload; not applied to idempotent producers")
    began = time.monotonic()
    try:
        say(f"starting a controller and {options.brokers} brokers in {root}")
        cluster.start()
        if disk is not None:
            disk.prepare()
            notes.append(f"disk fault by {disk.method}")
        cluster.set_faults(False)
        _create_topic(cluster.bootstrap, topic, options.partitions, cluster.client_security)
        cluster.set_faults(True)

        duration = options.duration()
        share, extra = divmod(options.records, len(options.clients))
        workloads: list[Workload] = []
        for k, client in enumerate(options.clients):
            n = share + (1 if k < extra else 0)
            workloads.append(WORKLOADS[client](cluster.bootstrap, topic, n, client,
                                               rate=n / duration if duration else None, gate=gate,
                                               timeout_s=options.timeout_s,
                                               config=client_config(faults, client),
                                               security=cluster.client_security))
        runner = FaultRunner(cluster, topic, options.partitions,
                             [f for f in options.faults if f in PROCESS_FAULTS], options.seed, gate, disk,
                             on_event=lambda e: say(e.line()))
        say(f"producing {options.records} records with {', '.join(options.clients)} under "
            f"{', '.join(options.faults) or 'no faults'}")
        threads = [threading.Thread(target=_guard(w), name=f"workload-{w.producer}", daemon=True)
                   for w in workloads]
        runner.start()
        for t in threads:
            t.start()
        deadline = time.monotonic() + options.timeout_s + (duration or 0) + 60
        for t in threads:
            t.join(max(deadline - time.monotonic(), 1))
        say("stopping the faults")
        runner.stop()
        if runner.error is not None:
            notes.append(f"HARNESS: a fault could not run: {runner.error!r}")
        for w, t in zip(workloads, threads):
            if t.is_alive():  # a client stuck past its own delivery timeout: its finding, not a hang
                w.events.append(Event(10**12, w.client, w.instance, "fatal", b"", None, None,
                                      f"did not finish within {options.timeout_s:.0f}s of its delivery timeout"))
        cluster.set_faults(False)
        say("reading every partition from its start")
        log = _read_back(cluster.bootstrap, topic, runner.archive, options.timeout_s, cluster.client_security)
        events = [e for w in workloads for e in list(w.events)]
        report = check(events, log)
        counters = cluster.broker_counters()
        broker = {name: counters.get(key, 0) for key, name in _BROKER_COUNTERS.items()}
        broker["leader moves (controller)"] = sum(1 for e in runner.events if e.fault == "move")
        client_errors = _per_client(workloads, events)
        return VerifyResult(options, report, runner.events, dict(cluster.proxy_stats()),
                            {w.producer: dict(w.stats) for w in workloads}, broker,
                            time.monotonic() - began, notes, client_errors)
    finally:
        cluster.stop()
        if disk is not None:
            disk.close(keep_in=None if own_dir else root)
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)


def _read_back(bootstrap: str, topic: str, archive: dict, timeout_s: float, security: dict) -> dict:
    """Every partition from its start, behind what the expiry fault read before deleting it."""
    log, _ends = read_range(bootstrap, topic, timeout_s=timeout_s, security=security)
    for p, kept in archive.items():
        log[p] = kept + [r for r in log.get(p, []) if not kept or r[0] > kept[-1][0]]
    return log


def _per_client(workloads: list[Workload], events: list[Event]) -> dict[str, dict[str, int]]:
    """Adds sent/acknowledged to each workload's stats; returns its failed records by error.
    A workload's events span every instance of its producer (`name`, `name#2`, ...)."""
    errors: dict[str, dict[str, int]] = {}
    for w in workloads:
        mine = [e for e in events if e.producer == w.producer or e.producer.startswith(w.producer + "#")]
        kinds = Counter(e.kind for e in mine)
        w.stats.update(sent=kinds["send"], acknowledged=kinds["ack"])
        errors[w.producer] = dict(Counter((e.error or "?")[:120] for e in mine if e.kind in ("error", "fatal")))
    return errors


def _guard(w: Workload):
    def target() -> None:
        try:
            w.run()
        except Exception as e:  # noqa: BLE001 - a crashed workload is a client finding, not a hang
            w.events.append(Event(10**12, w.client, w.instance, "fatal", b"", None, None,
                                  f"workload crashed: {type(e).__name__}: {e}"[:300]))
    return target


def _create_topic(bootstrap: str, topic: str, partitions: int, security: dict) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, **security, "log_level": 3})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def activity_lines(result, clients_title: str) -> list[str]:
    """What a run went through, as both workloads report it: the faults that fired, what each
    client's recovery cost, what the brokers answered, the notes; ends with an empty line."""
    counts = Counter(e.fault for e in result.faults)
    lines = ["process faults fired: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none")
             + f"; proxy: {result.proxy.get('resets', 0)} resets, "
             f"{result.proxy.get('dropped_responses', 0)} responses dropped after the broker "
             f"wrote, {result.proxy.get('connections', 0)} connections"]
    lines += ["  " + e.line() for e in result.faults[:30]]
    if len(result.faults) > 30:
        lines.append(f"  ... {len(result.faults) - 30} more")
    lines.append(clients_title)
    for name, stats in result.clients.items():
        lines.append(f"  {name:<13} " + (", ".join(f"{k} {v}" for k, v in sorted(stats.items())) or "-"))
        for error, n in sorted(result.client_errors.get(name, {}).items()):
            lines.append(f"  {'':<13} failed: {n} x {error}")
    lines.append("brokers answered:")
    lines += [f"  {k:<48} {v}" for k, v in result.broker.items() if v]
    lines += [f"note: {n}" for n in result.notes]
    lines.append("")
    return lines


def render(result) -> str:
    """The readable report."""
    if not isinstance(result, VerifyResult):
        from oncelog.testing.txn_verify import render_transactions
        return render_transactions(result)
    o, r = result.options, result.report
    lines = [f"oncelog verify: seed {o.seed}, {o.security_protocol}, faults {','.join(o.faults) or '-'}, clients "
             f"{','.join(o.clients)}, {o.records} records, {o.brokers} brokers, "
             f"{o.partitions} partitions, {result.seconds:.0f}s",
             "",
             f"sent {r.sent}, acknowledged {r.acked}, failed {r.errors}, read back {r.read}"]
    lines += activity_lines(result, "clients (what recovery cost them; records that failed, by error):")
    if r.ok:
        lines.append("OK: no duplicates, no lost acknowledged writes, no inconsistent offsets, "
                     "no reordering, no fatal client errors")
    shown: Counter[str] = Counter()
    for f in r.findings:
        key = f"{f.blame}/{f.client}"
        shown[key] += 1
        if f.blame == "client" and shown[key] > 3:
            continue  # a client that fails the same way every time needs three examples, not forty
        lines.append(f"FINDING {f.kind} (blame: {f.blame}) partition {f.partition}: {f.detail}")
        lines += [f"    {h}" for h in f.history[:4]]
    for key, n in sorted(shown.items()):
        if key.startswith("client/") and n > 3:
            lines.append(f"... and {n - 3} more fatal errors of {key.split('/', 1)[1]}")
    if r.findings and r.broker_ok:
        lines.append("only client findings: the brokers kept every promise")
    return "\n".join(lines)
