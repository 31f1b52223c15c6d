"""The fault-run harness both workloads of `oncelog verify` run in (`testing.verify`: idempotent
producers; `testing.txn_verify`: transactional copy loops).

A run: a controller and brokers behind fault proxies in a directory of its own (kept when the
caller names one), the disk fault prepared, topics made with the faults off; then the workload's
threads under the faults, which stop when the threads end or at the latest after the first half
of the time budget (Jepsen's final heal: the workloads must then finish, so a run that never
recovers is told from one slowed by faults that keep coming while the machine is slow); then
the faults off for the read-back, and what the brokers answered. The result's common part
(`FaultRunResult`) is what every run reports besides its checker's verdict.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncelog.protocol.api import kafka_api_name
from oncelog.testing.cluster import LocalCluster
from oncelog.testing.faults import (
    PROCESS_FAULTS,
    FaultEvent,
    FaultRunner,
    FirstRound,
    FullDisk,
    process_env,
    proxy_config,
)

Say = Any  # Callable[[str], None]; a progress line
ROUND_CAP_S = 180.0   # how long faults may go on past the window for each to fire once


@dataclass
class FaultRunResult:
    """What a run went through, whatever its workload."""
    options: Any                           # testing.verify.VerifyOptions
    faults: list[FaultEvent]               # the process faults that fired
    proxy: dict[str, int]                  # the fault proxies' counts
    clients: dict[str, dict[str, int]]     # per client: what recovery cost it
    client_errors: dict[str, dict[str, int]]
    broker: dict[str, int]                 # what the brokers answered (`FaultRun.broker_answers`)
    seconds: float
    notes: list[str]

    @property
    def harness_ok(self) -> bool:
        """No fault failed to run (a HARNESS note): otherwise a clean report proves nothing."""
        return not any(n.startswith("HARNESS") for n in self.notes)

    def common_json(self) -> dict[str, Any]:
        o = self.options
        return {"seed": o.seed, "security_protocol": o.security_protocol, "faults": list(o.faults),
                "clients": list(o.clients), "records": o.records, "seconds": round(self.seconds, 1),
                "fault_counts": dict(Counter(e.fault for e in self.faults)),
                "fault_events": [e.__dict__ for e in self.faults], "proxy": self.proxy,
                "client_stats": self.clients, "client_errors": self.client_errors,
                "broker_answers": self.broker, "notes": self.notes}

    def activity_lines(self, clients_title: str) -> list[str]:
        """The faults that fired, what each client's recovery cost, what the brokers answered,
        the notes; ends with an empty line."""
        counts = Counter(e.fault for e in self.faults)
        lines = ["process faults fired: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none")
                 + f"; proxy: {self.proxy.get('resets', 0)} resets, "
                 f"{self.proxy.get('dropped_responses', 0)} responses dropped after the broker "
                 f"wrote, {self.proxy.get('connections', 0)} connections"]
        lines += ["  " + e.line() for e in self.faults[:30]]
        if len(self.faults) > 30:
            lines.append(f"  ... {len(self.faults) - 30} more")
        lines.append(clients_title)
        for name, stats in self.clients.items():
            lines.append(f"  {name:<13} " + (", ".join(f"{k} {v}" for k, v in sorted(stats.items())) or "-"))
            for error, n in sorted(self.client_errors.get(name, {}).items()):
                lines.append(f"  {'':<13} failed: {n} x {error}")
        lines.append("brokers answered:")
        lines += [f"  {k:<48} {v}" for k, v in self.broker.items() if v]
        lines += [f"note: {n}" for n in self.notes]
        lines.append("")
        return lines


class FaultRun:
    """One run's cluster, faults and directory: `with FaultRun(...) as run:` starts the cluster
    (faults off), `run.under_faults(threads)` runs the workload, leaving stops everything."""

    def __init__(self, options: Any, target: str, broker_overrides: dict[str, str], proxy_faults: set[str],
                 say: Say) -> None:
        """`target`: the topic the process faults aim at (its partition 0 holds the disk fault);
        `proxy_faults`: the faults the proxies apply."""
        self.options = options
        self.faults = set(options.faults)
        self.say = say
        self.target = target
        self.own_dir = options.workdir is None
        self.root = Path(tempfile.mkdtemp(prefix="oncelog-verify-")) if self.own_dir else Path(options.workdir)
        self.cluster = LocalCluster(self.root, options.brokers, broker_overrides,
                                    proxy_config(self.faults & proxy_faults, options.seed),
                                    env=process_env(self.faults), security_protocol=options.security_protocol)
        self.disk = FullDisk(self.cluster.data / f"{target}-0", self.cluster) if "disk" in self.faults else None
        self.gate = threading.Event()  # the workloads wait on it while a fault needs them to
        self.gate.set()
        # each process fault has its turn under load: workloads pace their records by the round
        self.first_round = FirstRound(sum(f in PROCESS_FAULTS for f in self.faults))
        self.notes: list[str] = []
        self.runner: FaultRunner | None = None
        self.began = time.monotonic()

    @property
    def security(self) -> dict[str, str]:
        return self.cluster.client_security

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def __enter__(self) -> FaultRun:
        try:
            self.say(f"starting a controller and {self.options.brokers} brokers in {self.root}")
            self.cluster.start()
            if self.disk is not None:
                self.disk.prepare()
                self.notes.append(f"disk fault by {self.disk.method}")
            self.cluster.set_faults(False)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.stop()
        if self.disk is not None:
            self.disk.close(keep_in=None if self.own_dir else self.root)
        if self.own_dir:
            shutil.rmtree(self.root, ignore_errors=True)

    def create_topic(self, topic: str) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.security, "log_level": 3})
        admin.create_topics([NewTopic(topic, self.options.partitions, 1)])[topic].result(30)

    def under_faults(self, threads: list[threading.Thread], grace_s: float, **runner_options: Any) -> None:
        """Start the faults and the threads; faults stop when the threads end or after the first
        half of the time budget, whichever comes first, but not before each fault fired once
        (up to `ROUND_CAP_S` more: on a slow machine the faults take longer, and a fault that
        never had its turn proves nothing). The threads get the whole budget, plus the time the
        round took beyond it, plus `grace_s`; those still running then are the caller's finding
        (`is_alive`). `runner_options`: what a workload adds to its `FaultRunner`."""
        options = self.options
        duration = options.duration() or 0
        self.cluster.set_faults(True)
        runner = self.runner = FaultRunner(self.cluster, self.target, options.partitions,
                                           [f for f in options.faults if f in PROCESS_FAULTS], options.seed,
                                           self.gate, self.disk, on_event=lambda e: self.say(e.line()),
                                           first_round=self.first_round, **runner_options)
        window = duration + options.timeout_s / 2
        began = time.monotonic()
        ended = threading.Event()
        late = [0.0]   # how long the round kept the faults on past the window

        def heal() -> None:
            if ended.wait(window):
                return
            if not self.first_round.over.is_set():
                self.say("faults go on until each has fired once")
                self.first_round.over.wait(ROUND_CAP_S)
                late[0] = time.monotonic() - began - window
            if ended.is_set():
                return
            self.say(f"faults stop after {time.monotonic() - began:.0f}s: the workloads finish without them")
            runner.stop()
            self.cluster.set_faults(False)
        healing = threading.Thread(target=heal, name="fault-heal", daemon=True)
        runner.start()
        healing.start()
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                left = began + options.timeout_s + duration + late[0] + grace_s - time.monotonic()
                if left <= 0:
                    break
                t.join(min(left, 1.0))
        ended.set()
        self.say("stopping the faults")
        runner.stop()
        if runner.error is not None:
            self.notes.append(f"HARNESS: a fault could not run: {runner.error!r}")
        self.cluster.set_faults(False)

    @property
    def fired(self) -> list[FaultEvent]:
        return self.runner.events if self.runner is not None else []

    def with_archive(self, log: dict[int, list]) -> dict[int, list]:
        """`log` (partition -> [(offset, value)] read from the target topic) behind what the
        expiry fault read before it deleted records."""
        archive = self.runner.archive if self.runner is not None else {}
        for p, kept in archive.items():
            log[p] = kept + [r for r in log.get(p, []) if not kept or r[0] > kept[-1][0]]
        return log

    def broker_answers(self, names: dict[str, str]) -> dict[str, int]:
        """The brokers' counters named in `names` (metric -> label), and the leader moves."""
        counters = self.cluster.broker_counters()
        for key in names:
            _check_api_label(key)
        broker = {label: counters.get(key, 0) for key, label in names.items()}
        broker["leader moves (controller)"] = sum(1 for e in self.fired if e.fault == "move")
        return broker

    def seconds(self) -> float:
        return time.monotonic() - self.began


def _check_api_label(key: str) -> None:
    """A counter looked up by an API name the broker does not use reads 0 forever, and a test
    asserting it is above 0 fails for the wrong reason (or one asserting 0 passes for the wrong
    one): the names are Kafka's (`api=WriteTxnMarkers`), checked here against the broker's table."""
    if "{api=" not in key:
        return
    api = key.split("{api=", 1)[1].split(",", 1)[0].rstrip("}")
    if api not in {kafka_api_name(k) for k in range(100)}:
        raise ValueError(f"{key}: the broker labels no API {api!r} (its labels are Kafka's API names)")
