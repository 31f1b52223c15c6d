"""`oncelog verify --workload transactions`: copy loops of each client (`testing.txn_workloads`)
move a pre-filled input topic to an output topic in transactions while the faults run (for the
first half of the time budget at most, `testing.fault_run`; then they stop and the loops must
finish), recording a history
(`testing.txn_history`); then the output is read read_committed and read_uncommitted, the inputs
are read back, and the history is judged (`testing.txn_checker`) with Jepsen's Kafka anomaly
classes and the copy's promise (every input exactly once), per client and transaction protocol.
The process faults (kill, move, pause, storage, expiry, disk) target the output topic; late-endtxn holds
an EndTxn back until its producer has begun the next transaction."""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from oncelog.testing.fault_run import FaultRun, FaultRunResult
from oncelog.testing.faults import (
    CLIENT_FAULTS,
    NETWORK_FAULTS,
    PAUSE_TRANSACTION_TIMEOUT_MS,
    TXN_FAULTS,
    broker_overrides,
)
from oncelog.testing.txn_checker import ALLOWED, JEPSEN_CLASSES, TxnReport, check_transactions, whose
from oncelog.testing.txn_history import History
from oncelog.testing.txn_workloads import TxnWorkload
from oncelog.testing.workloads import read_range

TXN_CLIENTS = ("oncelog", "librdkafka")
OUTPUT = "verify-out"

_BROKER_COUNTERS = {
    "oncelog_requests_total{api=WriteTxnMarkers}": "WriteTxnMarkers requests (broker to broker)",
    "oncelog_request_errors_total{api=WriteTxnMarkers,error=NOT_LEADER_OR_FOLLOWER}":
        "write_txn_markers NOT_LEADER_OR_FOLLOWER",
    "oncelog_requests_total{api=AddPartitionsToTxn}": "AddPartitionsToTxn requests",
    "oncelog_requests_total{api=EndTxn}": "EndTxn requests",
    "oncelog_request_errors_total{api=Produce,error=INVALID_PRODUCER_EPOCH}": "produce INVALID_PRODUCER_EPOCH",
    # a transactional batch refused by its KIP-890 verification (TRANSACTION_ABORTABLE from Produce
    # v11, INVALID_TXN_STATE below): the transaction ended, or (issue 24) a pipelined batch's check
    # was voided by the one behind it
    "oncelog_request_errors_total{api=Produce,error=TRANSACTION_ABORTABLE}": "produce TRANSACTION_ABORTABLE",
    "oncelog_request_errors_total{api=Produce,error=INVALID_TXN_STATE}": "produce INVALID_TXN_STATE",
    "oncelog_request_errors_total{api=Produce,error=OUT_OF_ORDER_SEQUENCE_NUMBER}":
        "produce OUT_OF_ORDER_SEQUENCE_NUMBER",
    "oncelog_request_errors_total{api=Produce,error=NOT_LEADER_OR_FOLLOWER}": "produce NOT_LEADER_OR_FOLLOWER",
}


@dataclass
class TxnVerifyResult(FaultRunResult):
    report: TxnReport
    history: History = field(default_factory=History)

    @property
    def ok(self) -> bool:
        return self.report.ok and self.harness_ok

    def to_json(self) -> dict:
        return {"ok": self.ok, "workload": "transactions", **self.common_json(), "report": self.report.to_json()}


def run_transactions(options, progress=None) -> TxnVerifyResult:
    say = progress or (lambda _msg: None)
    faults = set(options.faults)
    overrides = {**broker_overrides(faults), "transaction.state.log.num.partitions": "4"}
    with FaultRun(options, OUTPUT, overrides, set(NETWORK_FAULTS + CLIENT_FAULTS + TXN_FAULTS), say) as fault_run:
        if "giveup" in faults:
            fault_run.notes.append("giveup is a fault of the idempotent producer workload; not applied to copy loops")
        bootstrap, security, notes = fault_run.bootstrap, fault_run.security, fault_run.notes
        share, extra = divmod(options.records, len(options.clients))
        duration = options.duration()
        history = History()
        workloads = []
        pausable: list = []   # pause: a copy loop per client runs in its own process, which it stops
        for k, client in enumerate(options.clients):
            n = share + (1 if k < extra else 0)
            w = TxnWorkload(bootstrap, client, f"verify-in-{client}", OUTPUT, options.partitions, n,
                            seed=options.seed * 100 + k, gate=fault_run.gate,
                            timeout_s=options.timeout_s + (duration or 0),
                            rate=n / duration if duration else None, security=security, history=history,
                            children=pausable)
            if "pause" in faults:
                w.transaction_timeout_ms, w.pausable = PAUSE_TRANSACTION_TIMEOUT_MS, 1
            workloads.append(w)
        fault_run.create_topic(OUTPUT)
        ends = {}
        for w in workloads:
            fault_run.create_topic(w.in_topic)
            say(f"filling {w.in_topic} with {w.records} records")
            ends[w.client] = w.fill()
        say(f"copying {options.records} records in transactions with {', '.join(options.clients)} under "
            f"{', '.join(options.faults) or 'no faults'}")
        threads = [threading.Thread(target=w.run, args=(ends[w.client],), name=f"txn-{w.client}", daemon=True)
                   for w in workloads]
        fault_run.under_faults(threads, grace_s=120, pausable_clients=pausable)
        for child in pausable:   # what the copy loops in their own processes did, in time order
            history.merge(child.ops)
        for w, t in zip(workloads, threads):
            if t.is_alive():
                notes.append(f"{w.client}: its copy loops did not stop")
            notes += w.notes
        say("reading the output read_committed and read_uncommitted")
        stuck: set[int] = set()
        committed, _ = read_range(bootstrap, OUTPUT, timeout_s=options.timeout_s, unread=stuck, security=security)
        uncommitted, _ = read_range(bootstrap, OUTPUT, timeout_s=options.timeout_s,
                                    isolation="read_uncommitted", security=security)
        committed = fault_run.with_archive(committed)  # what the expiry fault deleted (read read_committed)
        covered: dict[bytes, bool] = {}
        inputs = {}
        for w in workloads:  # which inputs the group's final committed offsets cover
            offsets = w.committed_offsets() or {}
            source, _ = read_range(bootstrap, w.in_topic, timeout_s=options.timeout_s, security=security)
            inputs[w.in_topic] = source
            for p, recs in source.items():
                for offset, value in recs:
                    covered[value] = offset < offsets.get(p, 0)
            for value in w.values():
                covered.setdefault(value, True)  # not in the input topic: lost before the copy
        if options.workdir is not None:
            history.dump(fault_run.root / "history.jsonl")
        archived = fault_run.runner is not None and bool(fault_run.runner.archive)
        report = check_transactions(history, committed, uncommitted, covered, inputs=inputs, output=OUTPUT,
                                    stuck=stuck, expect_aborts=not archived)
        if report.not_copied:
            notes.append(f"{report.not_copied} inputs were not copied when the run ended (beyond the "
                         "groups' committed offsets): a slow run, not a loss")
        return TxnVerifyResult(options=options, report=report, faults=fault_run.fired,
                               proxy=dict(fault_run.cluster.proxy_stats()),
                               clients={w.client: dict(w.stats) for w in workloads},
                               client_errors={w.client: dict(w.errors) for w in workloads},
                               broker=fault_run.broker_answers(_BROKER_COUNTERS), seconds=fault_run.seconds(),
                               notes=notes, history=history)


def render_transactions(result: TxnVerifyResult) -> str:
    o, r = result.options, result.report
    lines = [f"oncelog verify --workload transactions: seed {o.seed}, {o.security_protocol}, "
             f"faults {','.join(o.faults) or '-'}, "
             f"clients {','.join(o.clients)}, {o.records} records, {o.brokers} brokers, "
             f"{o.partitions} partitions, {result.seconds:.0f}s", "",
             f"inputs {r.inputs}, output read_committed {r.committed_read}, read_uncommitted "
             f"{r.uncommitted_read} (of which {r.aborted_seen} from aborted transactions); inputs not "
             f"copied when the run ended: {r.not_copied}"]
    lines += result.activity_lines("copy loops (what recovery cost them; errors they met):")
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
