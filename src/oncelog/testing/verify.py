"""`oncelog verify`: a cluster on this machine behind fault proxies, producers of several clients
writing unique values while faults run, then every partition read from its start and checked.

The result holds the checker's report, the faults that fired, what the clients said recovery cost
(retries, epoch bumps, sequence resets) and what the brokers answered (error codes, duplicates),
so that a run shows both that nothing was lost and that the faults really bit. The faults stop
when the producers finish or after the first half of the time budget (`testing.fault_run`, the
harness both workloads run in)."""
from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from oncelog.protocol.errors import KafkaProtocolError
from oncelog.testing.batch_identity import batch_identities
from oncelog.testing.checker import Event, Report, check, reclassify_restamped
from oncelog.testing.fault_run import FaultRun, FaultRunResult
from oncelog.testing.faults import (
    ALL_FAULTS,
    CLIENT_FAULTS,
    KNOWN_FAULTS,
    NETWORK_FAULTS,
    PROCESS_FAULTS,
    broker_overrides,
    client_config,
)
from oncelog.testing.workloads import WORKLOADS, Workload, read_range

log = logging.getLogger(__name__)

CLIENTS = tuple(WORKLOADS)
WORKLOAD_KINDS = ("produce", "transactions", "share")


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
    workload: str = "produce"         # or "transactions": copy loops (testing.txn_verify); "share": share groups
    share_dlq: bool = False           # share workload: the group has a dead-letter topic (KIP-1191)

    def __post_init__(self) -> None:
        if self.workload not in WORKLOAD_KINDS:
            raise ValueError(f"unknown workload {self.workload!r}; choose from {', '.join(WORKLOAD_KINDS)}")
        if self.workload == "transactions":
            from oncelog.testing.txn_verify import TXN_CLIENTS
            if set(self.clients) - set(TXN_CLIENTS):
                raise ValueError(f"the transactions workload runs {', '.join(TXN_CLIENTS)}, not "
                                 f"{', '.join(sorted(set(self.clients) - set(TXN_CLIENTS)))}")
        if self.workload == "share":
            from oncelog.testing.share_verify import SHARE_CLIENTS
            if set(self.clients) - set(SHARE_CLIENTS):
                raise ValueError(f"the share workload runs {', '.join(SHARE_CLIENTS)} share consumers, not "
                                 f"{', '.join(sorted(set(self.clients) - set(SHARE_CLIENTS)))}")
        if self.share_dlq and self.workload != "share":
            raise ValueError("--share-dlq is an option of the share workload")
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
        if self.workdir is not None and "," in str(self.workdir):
            # it becomes the brokers' log.dirs, a comma-separated list as in Kafka
            raise ValueError(f"the work directory {str(self.workdir)!r} has a comma: brokers would read "
                             "it as several log directories")

    def duration(self) -> float | None:
        if self.duration_s is not None:
            return self.duration_s or None
        # paced, so that there are many requests for the network faults to hit, and still some for
        # the last process faults (a pause takes up to 13 s of the schedule: twice the share)
        shares = sum(f in PROCESS_FAULTS for f in self.faults) + ("pause" in self.faults)
        return max(10.0, 8.0 * shares)


@dataclass
class VerifyResult(FaultRunResult):
    report: Report

    @property
    def ok(self) -> bool:
        return self.report.broker_ok and self.harness_ok

    def to_json(self) -> dict:
        return {"ok": self.ok, **self.common_json(), "report": self.report.to_json()}


# broker counters worth showing, and the names they get in the report
_BROKER_COUNTERS = {
    "oncelog_request_errors_total{api=Produce,error=OUT_OF_ORDER_SEQUENCE_NUMBER}":
        "produce OUT_OF_ORDER_SEQUENCE_NUMBER",
    "oncelog_request_errors_total{api=Produce,error=UNKNOWN_PRODUCER_ID}": "produce UNKNOWN_PRODUCER_ID",
    "oncelog_request_errors_total{api=Produce,error=DUPLICATE_SEQUENCE_NUMBER}": "produce DUPLICATE_SEQUENCE_NUMBER",
    "oncelog_request_errors_total{api=Produce,error=INVALID_PRODUCER_EPOCH}": "produce INVALID_PRODUCER_EPOCH",
    "oncelog_request_errors_total{api=Produce,error=NOT_LEADER_OR_FOLLOWER}": "produce NOT_LEADER_OR_FOLLOWER",
    "oncelog_request_errors_total{api=Produce,error=KAFKA_STORAGE_ERROR}": "produce KAFKA_STORAGE_ERROR",
    "oncelog_request_errors_total{api=Produce,error=REQUEST_TIMED_OUT}": "produce REQUEST_TIMED_OUT",
    "oncelog_request_errors_total{api=InitProducerId,error=COORDINATOR_LOAD_IN_PROGRESS}":
        "init_producer_id COORDINATOR_LOAD_IN_PROGRESS",
    "oncelog_requests_total{api=InitProducerId}": "init_producer_id requests",
    "oncelog_producer_state_duplicates_total{kind=window}": "duplicates answered from the window",
    "oncelog_producer_state_duplicates_total{kind=tail}": "duplicates answered from the log tail",
    "oncelog_producer_state_expirations_total": "producer states expired",
    "oncelog_producer_state_restored_total": "expired producers restored from the log",
}


def run(options: VerifyOptions, progress=None):
    """Runs one verification; `progress(message)` is called as phases start. A VerifyResult, or
    for the transactions workload a `txn_verify.TxnVerifyResult`, for the share workload a
    `share_verify.ShareVerifyResult`."""
    if options.workload == "transactions":
        from oncelog.testing.txn_verify import run_transactions
        return run_transactions(options, progress)
    if options.workload == "share":
        from oncelog.testing.share_verify import run_share
        return run_share(options, progress)
    say = progress or (lambda _msg: None)
    faults = set(options.faults)
    topic = "verify"
    with FaultRun(options, topic, broker_overrides(faults), set(NETWORK_FAULTS + CLIENT_FAULTS), say) as fault_run:
        if "late-endtxn" in faults:
            fault_run.notes.append("late-endtxn is a fault of the transactions workload; not applied to idempotent "
                                   "producers")
        fault_run.create_topic(topic)
        duration = options.duration()
        share, extra = divmod(options.records, len(options.clients))
        workloads: list[Workload] = []
        for k, client in enumerate(options.clients):
            n = share + (1 if k < extra else 0)
            workloads.append(WORKLOADS[client](fault_run.bootstrap, topic, n, client,
                                               rate=n / duration if duration else None, gate=fault_run.gate,
                                               share=fault_run.first_round.share,
                                               timeout_s=options.timeout_s,
                                               config=client_config(faults, client),
                                               security=fault_run.security))
        say(f"producing {options.records} records with {', '.join(options.clients)} under "
            f"{', '.join(options.faults) or 'no faults'}")
        threads = [threading.Thread(target=_guard(w), name=f"workload-{w.producer}", daemon=True)
                   for w in workloads]
        fault_run.under_faults(threads, grace_s=60)
        for w, t in zip(workloads, threads):
            if t.is_alive():  # a client stuck past its own delivery timeout: its finding, not a hang
                w.events.append(Event(10**12, w.client, w.instance, "fatal", b"", None, None,
                                      f"did not finish within {options.timeout_s:.0f}s of its delivery timeout"))
        say("reading every partition from its start")
        log, _ends = read_range(fault_run.bootstrap, topic, timeout_s=options.timeout_s, security=fault_run.security)
        events = [e for w in workloads for e in list(w.events)]
        report = check(events, fault_run.with_archive(log))
        if not fault_run.security:   # PLAINTEXT (the raw reads speak nothing else)
            reclassify_restamped(report, lambda places: _identities(fault_run.bootstrap, topic, places))
        client_errors = _per_client(workloads, events)
        return VerifyResult(options=options, report=report, faults=fault_run.fired,
                            proxy=dict(fault_run.cluster.proxy_stats()),
                            clients={w.producer: dict(w.stats) for w in workloads}, client_errors=client_errors,
                            broker=fault_run.broker_answers(_BROKER_COUNTERS), seconds=fault_run.seconds(),
                            notes=fault_run.notes)


def _identities(bootstrap: str, topic: str, places: list[tuple[int, int]]) -> dict:
    try:
        return batch_identities(bootstrap, topic, places)
    except (OSError, KafkaProtocolError) as e:   # then the duplicates stay the broker's to explain too
        log.warning("could not read the duplicates' batch headers: %s", e)
        return {}


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


def render(result) -> str:
    """The readable report."""
    from oncelog.testing.share_verify import ShareVerifyResult, render_share
    if isinstance(result, ShareVerifyResult):
        return render_share(result)
    if not isinstance(result, VerifyResult):
        from oncelog.testing.txn_verify import render_transactions
        return render_transactions(result)
    o, r = result.options, result.report
    lines = [f"oncelog verify: seed {o.seed}, {o.security_protocol}, faults {','.join(o.faults) or '-'}, clients "
             f"{','.join(o.clients)}, {o.records} records, {o.brokers} brokers, "
             f"{o.partitions} partitions, {result.seconds:.0f}s",
             "",
             f"sent {r.sent}, acknowledged {r.acked}, failed {r.errors}, read back {r.read}"]
    lines += result.activity_lines("clients (what recovery cost them; records that failed, by error):")
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
