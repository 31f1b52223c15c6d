"""`oncelog verify --workload transactions`: copy loops of each client (`testing.txn_workloads`)
move a pre-filled input topic to an output topic in transactions while the faults run (for the
first half of the time budget; then they stop and the loops must finish), recording a history
(`testing.txn_history`); then the output is read read_committed and read_uncommitted, the inputs
are read back, and the history is judged (`testing.txn_checker`) with Jepsen's Kafka anomaly
classes and the copy's promise (every input exactly once), per client and transaction protocol.
The process faults (kill, move, storage, expiry, disk) target the output topic; late-endtxn holds
an EndTxn back until its producer has begun the next transaction."""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncelog.testing.cluster import LocalCluster
from oncelog.testing.faults import (
    CLIENT_FAULTS,
    NETWORK_FAULTS,
    PAUSE_TRANSACTION_TIMEOUT_MS,
    PROCESS_FAULTS,
    TXN_FAULTS,
    FaultEvent,
    FaultRunner,
    FullDisk,
    broker_overrides,
    process_env,
    proxy_config,
)
from oncelog.testing.txn_checker import ALLOWED, JEPSEN_CLASSES, TxnReport, check_transactions, whose
from oncelog.testing.txn_history import History
from oncelog.testing.txn_workloads import TxnWorkload
from oncelog.testing.workloads import read_range

TXN_CLIENTS = ("oncelog", "librdkafka")
OUTPUT = "verify-out"

_BROKER_COUNTERS = {
    "oncelog_requests_total{api=write_txn_markers}": "WriteTxnMarkers requests (broker to broker)",
    "oncelog_request_errors_total{api=write_txn_markers,error=NOT_LEADER_OR_FOLLOWER}":
        "write_txn_markers NOT_LEADER_OR_FOLLOWER",
    "oncelog_requests_total{api=add_partitions_to_txn}": "AddPartitionsToTxn requests",
    "oncelog_requests_total{api=end_txn}": "EndTxn requests",
    "oncelog_request_errors_total{api=produce,error=INVALID_PRODUCER_EPOCH}": "produce INVALID_PRODUCER_EPOCH",
    # a transactional batch refused by its KIP-890 verification (TRANSACTION_ABORTABLE from Produce
    # v11, INVALID_TXN_STATE below): the transaction ended, or (issue 24) a pipelined batch's check
    # was voided by the one behind it
    "oncelog_request_errors_total{api=produce,error=TRANSACTION_ABORTABLE}": "produce TRANSACTION_ABORTABLE",
    "oncelog_request_errors_total{api=produce,error=INVALID_TXN_STATE}": "produce INVALID_TXN_STATE",
    "oncelog_request_errors_total{api=produce,error=OUT_OF_ORDER_SEQUENCE_NUMBER}":
        "produce OUT_OF_ORDER_SEQUENCE_NUMBER",
    "oncelog_request_errors_total{api=produce,error=NOT_LEADER_OR_FOLLOWER}": "produce NOT_LEADER_OR_FOLLOWER",
}


@dataclass
class TxnVerifyResult:
    options: Any  # verify.VerifyOptions (which imports this module)
    report: TxnReport
    faults: list[FaultEvent]
    proxy: dict[str, int]
    clients: dict[str, dict[str, int]]
    client_errors: dict[str, dict[str, int]]
    broker: dict[str, int]
    seconds: float
    notes: list[str] = field(default_factory=list)
    history: History = field(default_factory=History)

    @property
    def ok(self) -> bool:
        return self.report.ok and not any(n.startswith("HARNESS") for n in self.notes)

    def to_json(self) -> dict:
        o = self.options
        return {"ok": self.ok, "workload": "transactions", "seed": o.seed, "security_protocol": o.security_protocol,
                "faults": list(o.faults),
                "clients": list(o.clients), "records": o.records, "seconds": round(self.seconds, 1),
                "fault_counts": dict(Counter(e.fault for e in self.faults)),
                "fault_events": [e.__dict__ for e in self.faults], "proxy": self.proxy,
                "client_stats": self.clients, "client_errors": self.client_errors,
                "broker_answers": self.broker, "notes": self.notes, "report": self.report.to_json()}


def run_transactions(options, progress=None) -> TxnVerifyResult:
    say = progress or (lambda _msg: None)
    faults = set(options.faults)
    own_dir = options.workdir is None
    root = Path(tempfile.mkdtemp(prefix="oncelog-verify-")) if own_dir else Path(options.workdir)
    overrides = {**broker_overrides(faults), "transaction.state.log.num.partitions": "4"}
    cluster = LocalCluster(root, options.brokers, overrides,
                           proxy_config(faults & set(NETWORK_FAULTS + CLIENT_FAULTS + TXN_FAULTS), options.seed),
                           env=process_env(faults), security_protocol=options.security_protocol)
    disk = FullDisk(cluster.data / f"{OUTPUT}-0", cluster) if "disk" in faults else None
    gate = threading.Event()
    gate.set()
    notes: list[str] = []
    if "giveup" in faults:
        notes.append("giveup is a fault of the idempotent producer workload; not applied to copy loops")
    began = time.monotonic()
    try:
        say(f"starting a controller and {options.brokers} brokers in {root}")
        cluster.start()
        if disk is not None:
            disk.prepare()
            notes.append(f"disk fault by {disk.method}")
        cluster.set_faults(False)
        share, extra = divmod(options.records, len(options.clients))
        duration = options.duration()
        history = History()
        workloads = []
        pausable: list = []   # pause: a copy loop per client runs in its own process, which it stops
        for k, client in enumerate(options.clients):
            n = share + (1 if k < extra else 0)
            w = TxnWorkload(cluster.bootstrap, client, f"verify-in-{client}", OUTPUT, options.partitions, n,
                            seed=options.seed * 100 + k, gate=gate, timeout_s=options.timeout_s + (duration or 0),
                            rate=n / duration if duration else None, security=cluster.client_security,
                            history=history, children=pausable)
            if "pause" in faults:
                w.transaction_timeout_ms, w.pausable = PAUSE_TRANSACTION_TIMEOUT_MS, 1
            workloads.append(w)
        from oncelog.testing.verify import _create_topic
        _create_topic(cluster.bootstrap, OUTPUT, options.partitions, cluster.client_security)
        ends = {}
        for w in workloads:
            _create_topic(cluster.bootstrap, w.in_topic, options.partitions, cluster.client_security)
            say(f"filling {w.in_topic} with {w.records} records")
            ends[w.client] = w.fill()
        cluster.set_faults(True)
        runner = FaultRunner(cluster, OUTPUT, options.partitions,
                             [f for f in options.faults if f in PROCESS_FAULTS], options.seed, gate, disk,
                             on_event=lambda e: say(e.line()), pausable_clients=pausable)
        say(f"copying {options.records} records in transactions with {', '.join(options.clients)} under "
            f"{', '.join(options.faults) or 'no faults'}")
        threads = [threading.Thread(target=w.run, args=(ends[w.client],), name=f"txn-{w.client}", daemon=True)
                   for w in workloads]
        # Faults for the first half of the time budget, then quiet (Jepsen's final heal): the
        # loops must then finish, so a run that never recovers is told from one slowed by faults
        # that keep coming while the machine is slow.
        window = (duration or 0) + options.timeout_s / 2

        def heal() -> None:
            say(f"faults stop after {window:.0f}s: the copy loops finish without them")
            runner.stop()
            cluster.set_faults(False)
        healing = threading.Timer(window, heal)
        healing.daemon = True
        runner.start()
        healing.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(options.timeout_s + (duration or 0) + 120)
        healing.cancel()
        say("stopping the faults")
        runner.stop()
        if runner.error is not None:
            notes.append(f"HARNESS: a fault could not run: {runner.error!r}")
        for w, t in zip(workloads, threads):
            if t.is_alive():
                notes.append(f"{w.client}: its copy loops did not stop")
            notes += w.notes
        for child in pausable:   # what the copy loops in their own processes did, in time order
            history.merge(child.ops)
        cluster.set_faults(False)
        say("reading the output read_committed and read_uncommitted")
        stuck: set[int] = set()
        security = cluster.client_security
        committed, _ = read_range(cluster.bootstrap, OUTPUT, timeout_s=options.timeout_s, unread=stuck,
                                  security=security)
        uncommitted, _ = read_range(cluster.bootstrap, OUTPUT, timeout_s=options.timeout_s,
                                    isolation="read_uncommitted", security=security)
        for p, kept in runner.archive.items():  # what the expiry fault deleted (read read_committed)
            committed[p] = kept + [r for r in committed.get(p, []) if not kept or r[0] > kept[-1][0]]
        covered: dict[bytes, bool] = {}
        inputs = {}
        for w in workloads:  # which inputs the group's final committed offsets cover
            offsets = w.committed_offsets() or {}
            source, _ = read_range(cluster.bootstrap, w.in_topic, timeout_s=options.timeout_s, security=security)
            inputs[w.in_topic] = source
            for p, recs in source.items():
                for offset, value in recs:
                    covered[value] = offset < offsets.get(p, 0)
            for value in w.values():
                covered.setdefault(value, True)  # not in the input topic: lost before the copy
        if options.workdir is not None:
            history.dump(root / "history.jsonl")
        report = check_transactions(history, committed, uncommitted, covered, inputs=inputs, output=OUTPUT,
                                    stuck=stuck, expect_aborts=not runner.archive)
        if report.not_copied:
            notes.append(f"{report.not_copied} inputs were not copied when the run ended (beyond the "
                         "groups' committed offsets): a slow run, not a loss")
        counters = cluster.broker_counters()
        broker = {name: counters.get(key, 0) for key, name in _BROKER_COUNTERS.items()}
        broker["leader moves (controller)"] = sum(1 for e in runner.events if e.fault == "move")
        return TxnVerifyResult(options, report, runner.events, dict(cluster.proxy_stats()),
                               {w.client: dict(w.stats) for w in workloads},
                               {w.client: dict(w.errors) for w in workloads}, broker,
                               time.monotonic() - began, notes, history)
    finally:
        cluster.stop()
        if disk is not None:
            disk.close(keep_in=None if own_dir else root)
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)


def render_transactions(result: TxnVerifyResult) -> str:
    from oncelog.testing.verify import activity_lines  # verify imports this module when it runs
    o, r = result.options, result.report
    lines = [f"oncelog verify --workload transactions: seed {o.seed}, {o.security_protocol}, "
             f"faults {','.join(o.faults) or '-'}, "
             f"clients {','.join(o.clients)}, {o.records} records, {o.brokers} brokers, "
             f"{o.partitions} partitions, {result.seconds:.0f}s", "",
             f"inputs {r.inputs}, output read_committed {r.committed_read}, read_uncommitted "
             f"{r.uncommitted_read} (of which {r.aborted_seen} from aborted transactions); inputs not "
             f"copied when the run ended: {r.not_copied}"]
    lines += activity_lines(result, "copy loops (what recovery cost them; errors they met):")
    late = {k.split(": ", 1)[1]: v for k, v in result.proxy.items() if k.startswith("late-endtxn: ")}
    if late:
        lines.append("late-endtxn: " + ", ".join(f"{k} {v}" for k, v in sorted(late.items())))
    lines.append("anomalies by client and transaction protocol (Jepsen's classes, then the copy's; "
                 f"{', '.join(sorted(ALLOWED))} allowed):")
    for who, kinds in r.by_client().items():
        txns = r.transactions.get(who)
        done = (f"transactions: {txns.get('ok', 0)} committed, {txns.get('fail', 0)} not committed, "
                f"{txns.get('info', 0)} unknown; " if txns else "")
        found = ", ".join(f"{k} {kinds[k]}" for k in sorted(kinds, key=_class_order)) or "none"
        lines.append(f"  {who:<16} {done}{found}")
    if r.ok:
        lines.append("OK: every input the groups committed copied exactly once, no anomaly of Jepsen's classes"
                     + (", aborted records present in the log" if r.aborted_seen else ""))
    for kind, n in sorted(r.counts().items(), key=lambda kv: _class_order(kv[0])):
        lines.append(f"{'ALLOWED' if kind in ALLOWED else 'ANOMALY'} {kind}: {n}")
    shown: Counter[str] = Counter()
    for f in r.findings:
        shown[f.kind] += 1
        if shown[f.kind] > 3:
            continue  # three examples of a class tell what it is
        lines.append(f"  {f.kind} ({whose(f)}) partition {f.partition}: "
                     f"{f.value!r} {f.detail}")
        lines += [f"      {h}" for h in f.history[:4]]
    return "\n".join(lines)


def _class_order(kind: str) -> tuple[int, str]:
    return (JEPSEN_CLASSES.index(kind) if kind in JEPSEN_CLASSES else len(JEPSEN_CLASSES), kind)
