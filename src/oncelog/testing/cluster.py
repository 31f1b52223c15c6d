"""A controller and N brokers as real processes on one machine, sharing one data directory (the
controller assigns partition leaders), each broker behind a fault proxy that its
`advertised.listeners` point at, so every client byte passes through a proxy (or without proxies,
clients straight to the brokers). Used by `oncelog verify` and the cluster tests; processes can be
killed with SIGKILL and restarted on the same ports and data."""
from __future__ import annotations

import asyncio
import time
import urllib.request
from collections import Counter
from pathlib import Path

from oncelog.storage import cluster_credential
from oncelog.testing.embedded import BrokerProcess, ControllerProcess, broker_overrides, free_port
from oncelog.testing.fault_proxy import FaultConfig, ThreadedFaultProxy
from oncelog.testing.late_endtxn import LateEndTxn

# how long a restarted broker or controller may take to listen again (a fault run restarts them
# under load; the first start of a run keeps the launcher's 30 s)
RESTART_TIMEOUT_S = 120.0


class LocalCluster:
    """Controller + `brokers` broker processes sharing `root/data`, broker i behind proxy i
    (`proxies=False`: clients connect to the brokers themselves)."""

    def __init__(self, root: str | Path, brokers: int = 2, overrides: dict[str, str] | None = None,
                 proxy_config: FaultConfig | None = None, env: dict[str, str] | None = None,
                 proxies: bool = True, security_protocol: str = "PLAINTEXT") -> None:
        self.root = Path(root)
        # SASL_SSL: brokers listen with TLS and SCRAM-SHA-512 (key material made here with openssl),
        # the proxies pass TLS through, clients take `client_security` on top of bootstrap.servers
        self.security_protocol = security_protocol
        self.client_security: dict[str, str] = {}
        self._security_overrides: dict[str, str] = {}
        self.data = self.root / "data"
        self.n = brokers
        self.overrides = dict(overrides or {})
        self.proxy_config = proxy_config or FaultConfig()
        c = self.proxy_config
        # one for all proxies: an EndTxn held at the coordinator's is delivered by the partition leader's
        self.late = (LateEndTxn(c.late_endtxn_probability, c.late_endtxn_hold_s, c.seed)
                     if c.late_endtxn_probability else None)
        self.with_proxies = proxies
        self.env = dict(env or {})  # for every process (e.g. the failpoint ledger for power-loss)
        # the cluster credential, as `serve --brokers N` keeps it: a 0600 file in the data directory,
        # which the controller and the brokers read (nothing secret on a command line)
        self.credential_file = cluster_credential.path_in(self.data)
        self.controller = ControllerProcess(self.root / "metadata", log_file=self.root / "controller.log",
                                            env=self.env, credential_file=self.credential_file)
        self.brokers: dict[int, BrokerProcess] = {}
        self.proxies: dict[int, ThreadedFaultProxy] = {}
        self.metrics_ports: dict[int, int] = {}
        self.counters: Counter[str] = Counter()  # broker metrics summed over process lifetimes
        # partitions that move together: a move of any of them moves them all (a share group's
        # share-partitions live on the broker that coordinates the group and leads the partition,
        # so its topic's partitions move with its `__consumer_offsets` partition)
        self.colocated: list[tuple[str, int]] = []

    def start(self) -> LocalCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        cluster_credential.load_or_create(self.credential_file)
        if self.security_protocol == "SASL_SSL" and not self.client_security:
            self._secure()
        self.controller.start()
        for i in range(1, self.n + 1):
            bport, mport = free_port(), free_port()
            settings = {**self.overrides, **self._security_overrides,
                        **broker_overrides(self.controller, i, user=None),
                        "oncelog.cluster": "true", "metrics.port": str(mport)}
            name = "SASL_SSL" if self.client_security else "PLAINTEXT"
            if self.client_security:
                settings["listeners"] = f"SASL_SSL://127.0.0.1:{bport}"
            if self.with_proxies:
                pport = free_port()
                seed = self.proxy_config.seed * 1000 + i  # one fault stream per proxy, fixed by the seed
                cfg = FaultConfig(**{**self.proxy_config.__dict__, "seed": seed})
                self.proxies[i] = ThreadedFaultProxy(f"127.0.0.1:{bport}", cfg, port=pport, late=self.late).start()
                settings["advertised.listeners"] = f"{name}://127.0.0.1:{pport}"
            self.metrics_ports[i] = mport
            self.brokers[i] = BrokerProcess(self.data, settings, port=bport,
                                            log_file=self.root / f"broker{i}.log", env=self.env).start()
        return self

    def _secure(self) -> None:
        import secrets

        from oncelog.controller.scram import format_log
        from oncelog.core.security.scram import parse_add_scram_list
        from oncelog.testing.secure import SCRAM_USERS, secure_overrides
        from oncelog.testing.tls import make_pki
        pki = make_pki(self.root / "pki")
        o = secure_overrides(pki)
        self._security_overrides = {k: v for k, v in o.items() if k in (
            "ssl.keystore.location", "sasl.enabled.mechanisms")}
        # the controller holds the credentials: written to its new metadata log, as serve --brokers does
        format_log(self.controller.metadata_dir, parse_add_scram_list(o["oncelog.add.scram"], secrets.token_bytes))
        self._security_overrides["listener.name.sasl_ssl.plain.sasl.jaas.config"] = \
            o["listener.name.sasl_ssl.plain.sasl.jaas.config"]
        self.client_security = {"security.protocol": "SASL_SSL", "ssl.ca.location": str(pki.ca),
                                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin",
                                "sasl.password": SCRAM_USERS["admin"]}

    @property
    def bootstrap(self) -> str:
        """What clients use: the proxies, or the brokers when there are none."""
        servers = self.proxies.values() if self.with_proxies else self.brokers.values()
        return ",".join(s.bootstrap for s in servers)

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
        if self.late is not None:
            out.update({f"late-endtxn: {k}": v for k, v in self.late.stats.items()})
        return out

    # ---------------------------------------------------------------- process faults

    def kill_broker(self, i: int) -> None:
        self._bank_metrics(i)
        self.brokers[i].kill()

    def start_broker(self, i: int) -> None:
        # a restart in the middle of a fault run: on a loaded machine (2 shared vCPUs, load
        # average 13-23) one took 31 s from the spawn to its listener, past the first start's
        # 30 s, and the run's fault thread stopped for it (a HARNESS note) though nothing failed
        self.brokers[i].start(timeout_s=RESTART_TIMEOUT_S)

    def pause_broker(self, i: int) -> None:
        """SIGSTOP broker i (its sockets stay open, its requests wait in them); `resume_broker`."""
        self.brokers[i].pause()

    def resume_broker(self, i: int) -> None:
        self.brokers[i].resume()

    def pause_controller(self) -> None:
        self.controller.pause()

    def resume_controller(self) -> None:
        self.controller.resume()

    def kill_controller(self) -> None:
        self.controller.kill()

    def start_controller(self) -> None:
        self.controller.start(timeout_s=RESTART_TIMEOUT_S)

    def move_leader(self, topic: str, partition: int, broker: int, timeout_s: float = 30) -> int:
        """AlterPartitionReassignments on the controller; returns the Kafka error code (0 = moved).
        A partition of `colocated` moves with the others (the first refusal's code)."""
        if (topic, partition) in self.colocated:
            codes = [self._move_one(t, p, broker, timeout_s) for t, p in self.colocated]
            return next((code for code in codes if code), 0)
        return self._move_one(topic, partition, broker, timeout_s)

    def _move_one(self, topic: str, partition: int, broker: int, timeout_s: float) -> int:
        from oncelog.broker.cluster.controller_client import ControllerClient

        async def run() -> int:
            credential = cluster_credential.load(self.credential_file)
            client = ControllerClient("127.0.0.1", self.controller.port, credential.username, credential.password,
                                      client_id="oncelog-verify")
            try:
                return (await client.move_leader(topic, partition, broker, int(timeout_s * 1000)))[0]
            finally:
                client.close()
        return asyncio.run(asyncio.wait_for(run(), timeout_s))

    def place(self, topic: str, wanted: dict[int, int], timeout_s: float = 30) -> None:
        """Moves partition p to broker wanted[p] and waits until the brokers' metadata say so."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
        for p, b in wanted.items():
            if self.move_leader(topic, p, b) != 0:
                raise RuntimeError(f"moving {topic}-{p} to broker {b} was refused")
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3, **self.client_security})
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                md = admin.list_topics(topic, timeout=10).topics[topic]
                if {p: m.leader for p, m in md.partitions.items()} == wanted:
                    return
            except (KafkaException, KeyError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} never led as {wanted}")
            time.sleep(0.1)

    # ---------------------------------------------------------------- observation

    def scrape(self, i: int) -> Counter[str]:
        """Counters of broker i's /metrics, summed over labels other than api/error/kind/event."""
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
                                 if k in ("api", "error", "kind", "event"))
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
