"""A controller and N brokers as real processes on one machine, each broker behind a fault proxy
that its `advertised.listeners` point at, so every client byte passes through a proxy. Used by
`oncelog verify` and the cluster tests; processes can be killed with SIGKILL and restarted on the
same ports and data."""
from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

from oncelog.testing.embedded import BrokerProcess, wait_for_line
from oncelog.testing.fault_proxy import FaultConfig, ThreadedFaultProxy

USER, PASSWORD = "broker", "broker-secret"
_CONTROLLER_LISTENING = re.compile(r"controller listening on ([\d.]+):(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ControllerProcess:
    """`oncelog controller` as a subprocess; restarts keep its port so brokers find it again."""

    def __init__(self, metadata_dir: str | Path, extra_users=(), port: int = 0,
                 log_file: str | Path | None = None, env: dict[str, str] | None = None) -> None:
        self.metadata_dir, self.extra_users, self.port = Path(metadata_dir), list(extra_users), port
        self.log_file = Path(log_file) if log_file else None
        self.env = dict(env or {})  # e.g. ONCELOG_FAILPOINTS for the next start
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30) -> "ControllerProcess":
        cmd = [sys.executable, "-m", "oncelog.cli.main", "controller", "--metadata-dir", str(self.metadata_dir),
               "--listener", f"127.0.0.1:{self.port}", "--user", f"{USER}:{PASSWORD}",
               "--cluster-principal", USER, "--session-timeout-ms", "2000"]
        for u in self.extra_users:
            cmd += ["--user", u]
        log = open(self.log_file, "ab") if self.log_file else subprocess.STDOUT
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env={**os.environ, **self.env})
        if self.log_file:
            log.close()
        m = wait_for_line(self.proc, _CONTROLLER_LISTENING, timeout_s)
        if m is None:
            self.kill()
            raise RuntimeError("controller did not start")
        self.port = int(m.group(2))
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.running:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.running:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def broker_overrides(controller: ControllerProcess, node_id: int, user: str = USER,
                     password: str = PASSWORD) -> dict[str, str]:
    return {"node.id": str(node_id), "controller.quorum.bootstrap.servers": controller.address,
            "controller.sasl.plain.username": user, "controller.sasl.plain.password": password}


class LocalCluster:
    """Controller + `brokers` broker processes sharing `root/data`, broker i behind proxy i."""

    def __init__(self, root: str | Path, brokers: int = 2, overrides: dict[str, str] | None = None,
                 proxy_config: FaultConfig | None = None, env: dict[str, str] | None = None) -> None:
        self.root = Path(root)
        self.data = self.root / "data"
        self.n = brokers
        self.overrides = dict(overrides or {})
        self.proxy_config = proxy_config or FaultConfig()
        self.env = dict(env or {})  # for every process (e.g. the failpoint ledger for power-loss)
        self.controller = ControllerProcess(self.root / "metadata", log_file=self.root / "controller.log",
                                            env=self.env)
        self.brokers: dict[int, BrokerProcess] = {}
        self.proxies: dict[int, ThreadedFaultProxy] = {}
        self.metrics_ports: dict[int, int] = {}
        self.counters: Counter[str] = Counter()  # broker metrics summed over process lifetimes

    def start(self) -> "LocalCluster":
        self.root.mkdir(parents=True, exist_ok=True)
        self.controller.start()
        for i in range(1, self.n + 1):
            bport, pport, mport = free_port(), free_port(), free_port()
            seed = self.proxy_config.seed * 1000 + i  # one fault stream per proxy, fixed by the seed
            cfg = FaultConfig(**{**self.proxy_config.__dict__, "seed": seed})
            self.proxies[i] = ThreadedFaultProxy(f"127.0.0.1:{bport}", cfg, port=pport).start()
            self.metrics_ports[i] = mport
            self.brokers[i] = BrokerProcess(self.data, {
                **self.overrides, **broker_overrides(self.controller, i), "oncelog.cluster": "true",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{pport}",
                "metrics.port": str(mport)}, port=bport, log_file=self.root / f"broker{i}.log",
                env=self.env).start()
        return self

    @property
    def bootstrap(self) -> str:
        """Through the proxies: what clients use."""
        return ",".join(p.bootstrap for p in self.proxies.values())

    def set_faults(self, enabled: bool) -> None:
        for p in self.proxies.values():
            p.proxy.enabled = enabled

    def proxy_stats(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for p in self.proxies.values():
            out["connections"] += p.stats.connections
            out["resets"] += p.stats.resets
            out["dropped_responses"] += p.stats.dropped_responses
            out["requests"] += sum(p.stats.requests.values())
        return out

    # ---------------------------------------------------------------- process faults

    def kill_broker(self, i: int) -> None:
        self._bank_metrics(i)
        self.brokers[i].kill()

    def start_broker(self, i: int) -> None:
        self.brokers[i].start()

    def kill_controller(self) -> None:
        self.controller.kill()

    def start_controller(self) -> None:
        self.controller.start()

    def move_leader(self, topic: str, partition: int, broker: int, timeout_s: float = 30) -> int:
        """AlterPartitionReassignments on the controller; returns the Kafka error code (0 = moved)."""
        from oncelog.broker.controller_client import ControllerClient

        async def run() -> int:
            client = ControllerClient("127.0.0.1", self.controller.port, USER, PASSWORD,
                                      client_id="oncelog-verify")
            try:
                return (await client.move_leader(topic, partition, broker, int(timeout_s * 1000)))[0]
            finally:
                client.close()
        return asyncio.run(asyncio.wait_for(run(), timeout_s))

    # ---------------------------------------------------------------- observation

    def scrape(self, i: int) -> Counter[str]:
        """Counters of broker i's /metrics, summed over labels other than api/error/kind."""
        from prometheus_client.parser import text_string_to_metric_families
        out: Counter[str] = Counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_ports[i]}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return out
        for family in text_string_to_metric_families(text):
            if family.type != "counter":
                continue
            for s in family.samples:
                if not s.name.endswith("_total"):
                    continue
                label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                                 if k in ("api", "error", "kind"))
                out[f"{s.name}{{{label}}}" if label else s.name] += int(s.value)
        return out

    def _bank_metrics(self, i: int) -> None:
        if self.brokers[i].running:
            self.counters.update(self.scrape(i))

    def broker_counters(self) -> Counter[str]:
        """Counters over every broker process so far (killed ones were scraped just before)."""
        out = Counter(self.counters)
        for i, b in self.brokers.items():
            if b.running:
                out.update(self.scrape(i))
        return out

    def stop(self) -> None:
        for i, b in self.brokers.items():
            self._bank_metrics(i)
            b.stop()
        self.controller.stop()
        for p in self.proxies.values():
            p.stop()
