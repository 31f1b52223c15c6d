"""The broker: its services wired together, started in order and stopped in reverse.

`Broker` is the broker side's composition root: it owns the partitions (`logs`), the group and
transaction coordinators, security and quotas, the controller link and the listeners; handlers see
it through the services they use (`broker.services`). Each connection (`net/connection.py`) hands
its frames, one at a time and in order, to the dispatch (`net/dispatch.py`, the one error
boundary), which runs the request's handler (`broker/handlers/`). Partitions are opened and
listeners bound before anything is served: a client let in earlier would be told its topic does
not exist.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from oncelog.broker.cluster.controller_client import controller_client
from oncelog.broker.cluster.controller_link import ControllerLink
from oncelog.broker.cluster.producer_id_manager import ProducerIdManager
from oncelog.broker.config import BrokerConfig, ConfigError, new_cluster_id
from oncelog.broker.dynamic_config import DynamicBrokerConfig
from oncelog.broker.groups.consumer_groups import consumer_group_config, topic_metadata
from oncelog.broker.groups.coordinator import GroupCoordinator
from oncelog.broker.groups.ownership import GroupOwnership
from oncelog.broker.groups.share_dlq import ShareDeadLetters
from oncelog.broker.groups.share_groups import share_group_config
from oncelog.broker.logs.cluster_logs import ClusterLogs
from oncelog.broker.logs.fsync_batcher import GroupCommit
from oncelog.broker.logs.seam import Logs
from oncelog.broker.metrics import BrokerMetrics
from oncelog.broker.metrics_web import WebConfig
from oncelog.broker.net.bind_error import BindError
from oncelog.broker.net.connection import Connection
from oncelog.broker.net.connection_limits import ConnectionGate
from oncelog.broker.net.dispatch import Dispatcher
from oncelog.broker.net.request_context import LISTENER
from oncelog.broker.security.authentication import ListenerSecurity
from oncelog.broker.security.authorization import follow_acls, make_authorizer
from oncelog.broker.security.follower import SecurityFollower
from oncelog.broker.security.inter_broker import ClusterLogin, InterBrokerLink, cluster_credential
from oncelog.broker.security.quotas import BrokerQuotas
from oncelog.broker.security.scram_credentials import ControllerCredentials
from oncelog.broker.services import BrokerNotStarted
from oncelog.broker.txn.add_partitions import TxnCheck
from oncelog.broker.txn.coordinator import TxnCoordinatorService
from oncelog.core.log_limit import LogLimit, held_back
from oncelog.core.security.listeners import Endpoint
from oncelog.core.topic_names import is_internal
from oncelog.storage.cleaner import LogCleaner
from oncelog.storage.dir_lock import DirectoryLock
from oncelog.storage.disk_space import DiskSpace
from oncelog.storage.group_offsets import GroupOffsetStore
from oncelog.storage.log_manager import LogManager

log = logging.getLogger("oncelog.broker")

_T = TypeVar("_T")

class Broker:
    def __init__(self, config: BrokerConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.node_id = self.config["node.id"]
        self._clock = clock
        self.logs: Logs = LogManager(
            self.config.log_dirs, self.config.topic_defaults(), self.config.producer_config(), node_id=self.node_id,
            expiration_check_interval_ms=self.config["producer.id.expiration.check.interval.ms"],
            cleaner=self._cleaner())
        # made by start(); handlers read them through the properties below (`broker.services`)
        self._producer_ids: ProducerIdManager | None = None
        self._groups: GroupCoordinator | None = None
        self._group_ownership: GroupOwnership | None = None   # who coordinates a group
        self.share_dlq: ShareDeadLetters | None = None   # share groups' dead-letter topics (KIP-1191)
        self._txn: TxnCoordinatorService | None = None
        self._security: SecurityFollower | None = None
        self._credentials: ControllerCredentials | None = None
        self.controller_link: ControllerLink | None = None
        self.fatal = asyncio.Event()  # set when the broker must stop (e.g. no cluster rights)
        self.fatal_message = ""
        self.metrics = BrokerMetrics(lambda: self.logs.partitions(), self.config["metrics.resource.labels.enable"])
        self.metrics.watch(self)
        self.dispatcher = Dispatcher(self, self.metrics)
        self.cluster_id = self.config["cluster.id"]
        self.host, self.port = "", 0
        # per listener name: (host, port) bound and advertised; the first listener is the default
        self.bound: dict[str, tuple[str, int]] = {}
        self.advertised: dict[str, tuple[str, int]] = {}
        self.listener_security: dict[str, ListenerSecurity] = {}
        self.inter_broker: InterBrokerLink   # set by start(): how this broker and its peers reach each other
        self.metrics_port: int | None = None
        self._dir_locks: list[DirectoryLock] = []
        self.connections: set[Connection] = set()
        self._data_event = asyncio.Event()
        self._ticker: asyncio.Task | None = None
        # acks=all answers wait for their fsync; consumers see fsynced records (write.caching=false)
        self.group_commit = GroupCommit(self.now_ms, on_durable=self.data_appended)
        self.disk_space = DiskSpace(self.config.log_dirs, self.config["storage.min.free.bytes"])
        # KIP-890: a partition leader's question to the transaction coordinator before a producer's
        # first transactional batch of a transaction (transactional id, producer id, epoch,
        # partitions, add?) -> code per partition: `broker.txn.add_partitions`, set with the
        # coordinator; None: batches accepted as they come. Transactions V1 batches are only
        # verified with transaction.partition.verification.enable (Kafka's rule)
        self.txn_check: TxnCheck | None = None
        self.txn_verification = bool(self.config["transaction.partition.verification.enable"])
        # issue 18: ACLs and client quotas follow the controller's metadata log (security_follower)
        self.authorizer = make_authorizer(self.config)
        self.quotas = BrokerQuotas(self.config, self.now_ms)
        self.dynamic_config = DynamicBrokerConfig(self)   # follows the controller with `security`
        # listening sockets, connection limits and quotas, idle connections (broker/net/connection_limits.py)
        self.connection_gate = ConnectionGate(self.config, self.now_ms)
        self._wire_logs()

    def _wire_logs(self) -> None:
        """Markers are acknowledged after the group commit's fsync, timed by the broker's clock."""
        self.logs.durable = self.group_commit.durable
        self.logs.clock_ms = self.now_ms

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    @property
    def groups(self) -> GroupCoordinator:
        return _started(self._groups, "the group coordinator")

    @property
    def group_ownership(self) -> GroupOwnership:
        return _started(self._group_ownership, "the group ownership")

    @property
    def txn(self) -> TxnCoordinatorService:
        return _started(self._txn, "the transaction coordinator")

    @property
    def producer_ids(self) -> ProducerIdManager:
        return _started(self._producer_ids, "the producer id manager")

    @property
    def security(self) -> SecurityFollower:
        return _started(self._security, "the security follower")

    @property
    def credentials(self) -> ControllerCredentials:
        return _started(self._credentials, "the controller credentials")

    # The address a client is told to use is that of the listener it came in on (Kafka's
    # Metadata answers per listener); outside a request, the first listener's.
    @property
    def advertised_host(self) -> str:
        return self._advertised()[0]

    @property
    def advertised_port(self) -> int:
        return self._advertised()[1]

    def _advertised(self) -> tuple[str, int]:
        name = LISTENER.get()
        if name in self.advertised:
            return self.advertised[name]
        return next(iter(self.advertised.values()), ("", 0))

    def reload_tls(self) -> None:
        """SIGHUP: key and trust files are read again for new handshakes."""
        for sec in self.listener_security.values():
            if sec.tls is not None:
                sec.tls.reload()

    # ------------------------------------------------------------------ lifecycle
    def lock_directories(self) -> None:
        """Take this broker's data directories before anything reads them; raises DirectoryLocked
        (naming the holder) when another process has them: two brokers on one directory would
        overwrite each other's acknowledged records. Brokers of one cluster share theirs."""
        if self._dir_locks:
            return
        try:
            if self.config["oncelog.cluster"]:
                self._dir_locks.append(DirectoryLock.cluster_member(
                    self.config.log_dirs[0], f"node-{self.node_id}", f"broker {self.node_id}"))
            else:
                for d in self.config.log_dirs:
                    self._dir_locks.append(DirectoryLock.exclusive(d, "a broker"))
        except BaseException:
            self._release_directories()
            raise

    def _release_directories(self) -> None:
        for lock in self._dir_locks:
            lock.release()
        self._dir_locks = []

    async def start(self) -> tuple[str, int]:
        self.lock_directories()
        try:
            return await self._start()
        except BaseException:
            self.metrics.close()
            self._release_directories()
            raise

    async def _start(self) -> tuple[str, int]:
        first_dir = Path(self.config.log_dirs[0])
        self.cluster_id = self.cluster_id or _stored_cluster_id(first_dir)
        clustered = self.config["oncelog.cluster"]
        if not clustered:
            await self.logs.open(self.now_ms())
        c = self.config
        store = GroupOffsetStore(first_dir / "__consumer_offsets", shared=clustered,
                                 offsets_partitions=c["offsets.topic.num.partitions"])
        self._group_ownership = GroupOwnership(self, store)
        self._groups = GroupCoordinator(
            store, self.now_ms,
            c["group.initial.rebalance.delay.ms"], min_session_timeout_ms=c["group.min.session.timeout.ms"],
            max_session_timeout_ms=c["group.max.session.timeout.ms"],
            offsets_retention_ms=c["offsets.retention.minutes"] * 60000,
            offsets_retention_check_interval_ms=c["offsets.retention.check.interval.ms"],
            producer_id_expiration_ms=c["producer.id.expiration.ms"], owns=self.coordinates,
            consumer_groups=consumer_group_config(c),
            topics=lambda: topic_metadata(self.logs.topics, is_internal), share_groups=share_group_config(c))
        self.group_ownership.unload = self.groups.unload_partition
        self.share_dlq = ShareDeadLetters(self)
        self.inter_broker = InterBrokerLink.from_config(self.config, cluster_credential(self.config))
        await self._bind_listeners()
        if self.config["metrics.port"] >= 0:   # bound before registering: a port in use stops nothing started
            try:
                web = self.config["metrics.web.config.file"]
                self.metrics_port = self.metrics.serve(self.config["metrics.host"], self.config["metrics.port"],
                                                       self.config["connections.max.idle.ms"],
                                                       WebConfig.load(web) if web else None)
            except OSError as e:
                raise BindError("the metrics endpoint", self.config["metrics.host"], self.config["metrics.port"], e,
                                "metrics.port") from e
        await self._connect_controller()
        if self.config["oncelog.cluster"]:
            await self._join_cluster()
            self.dynamic_config.apply()    # the cluster's logs replaced the ones it was applied to
        # Before serving: a partition of __transaction_state left in Prepare* resumes its markers now.
        txn = self._txn = TxnCoordinatorService(self, self.producer_ids.producer_id_nowait)
        self.txn_check = txn.partitions.ask
        txn.start()
        if isinstance(self.logs, ClusterLogs):   # coordinators follow leadership as promptly as partitions
            self.logs.on_view += [self.group_ownership.reconcile, txn.reconcile]
        self.connection_gate.start({name: functools.partial(Connection, self, sec)
                                    for name, sec in self.listener_security.items()})
        self._ticker = asyncio.create_task(self._tick_loop())
        for name, (host, port) in self.bound.items():
            log.info("broker %d: listener %s (%s) on %s:%d, advertised %s:%d", self.node_id, name,
                     self.listener_security[name].protocol.name, host, port, *self.advertised[name])
        log.info("broker %d listening on %s:%d (advertised %s:%d), data in %s", self.node_id,
                 self.host, self.port, self.advertised_host, self.advertised_port,
                 ",".join(self.config.log_dirs))
        return self.host, self.port

    async def _bind_listeners(self) -> None:
        """Every listener bound now (ports known), serving only once the partitions are ready: a
        client let in earlier would be told its topic does not exist. TLS listeners accept TCP
        and start TLS per connection (`Connection`), so a failed handshake is logged with its
        address."""
        setup = self.config.listener_setup
        self._credentials = ControllerCredentials(self)
        cluster = ClusterLogin(self.inter_broker.credential)   # other brokers log in on every listener
        for endpoint, advertised in zip(setup.listeners, setup.advertised):
            sec = ListenerSecurity.from_config(self.config, endpoint, self.credentials.lookup, cluster,
                                               self.credentials.shapes)
            self.listener_security[endpoint.name] = sec
            try:
                host, port = self.connection_gate.bind(endpoint)
            except OSError as e:
                raise BindError(f"listener {endpoint.name}", endpoint.host, endpoint.port, e, "listeners") from e
            self.bound[endpoint.name] = (host, port)
            self.advertised[endpoint.name] = _advertised_address(endpoint, advertised, port)
        self.host, self.port = self.bound[setup.listeners[0].name]

    async def _connect_controller(self) -> None:
        """Register with the controller and take producer ids from its KIP-730 blocks (`oncelog
        serve` runs one in-process unless told where one is: `controller.embedded`)."""
        address = self.config["controller.quorum.bootstrap.servers"]
        if not address:
            raise ConfigError("controller.quorum.bootstrap.servers is not set: a broker takes its producer ids "
                              "from a controller (oncelog.controller.embedded runs one in-process)")
        # registered: the inter-broker listener, where the other brokers reach this one
        inter = self.inter_broker.listener
        link = self.controller_link = ControllerLink(
            controller_client(self.config), self.node_id, self.cluster_id, *self.advertised[inter.name],
            self.config["broker.heartbeat.interval.ms"], inter.name, int(inter.protocol))
        await link.register()
        link.start()
        self._producer_ids = ProducerIdManager(controller_client(self.config), self.node_id,
                                              lambda: link.epoch, on_fatal=self._fatal,
                                              prefetch=self.config["producer.id.block.prefetch"])
        # ACLs and quotas are in force before the first client is served (an empty set with
        # allow.everyone.if.no.acl.found would let anyone in)
        security = self._security = SecurityFollower(controller_client(self.config),
                                                     self.config["broker.heartbeat.interval.ms"])
        security.on_change += [lambda state: follow_acls(self.authorizer, state), self.quotas.follow,
                                    self.connection_gate.follow, self.dynamic_config.follow]
        follow_acls(self.authorizer, security.state)
        self.quotas.follow(security.state)
        self.connection_gate.follow(security.state)
        await security.catch_up()
        security.start()

    async def _join_cluster(self) -> None:
        """Shared storage: partitions follow the controller's leadership instead of a local registry."""
        if self.controller_link is None:
            raise RuntimeError("oncelog.cluster needs controller.quorum.bootstrap.servers")
        self.logs = ClusterLogs(
            self.config.log_dirs[0], self.config.topic_defaults(), self.config.producer_config(),
            controller_client(self.config), self.node_id, self.now_ms,
            expiration_check_interval_ms=self.config["producer.id.expiration.check.interval.ms"],
            cleaner=self._cleaner())
        self._wire_logs()
        await self.logs.open(self.now_ms())

    def group_coordinator(self, group_id: str) -> tuple[int, str, int] | None:
        """(node id, host, port) of the broker coordinating `group_id`: this one on a single node; in
        a cluster, the leader of the group's `__consumer_offsets` partition (`group_ownership`),
        None while it has none."""
        return self.group_ownership.coordinator(group_id)

    def open_connections(self) -> dict[str, int]:
        """Client connections per listener name (every listener, 0 where none)."""
        counts = dict.fromkeys(self.listener_security, 0)
        for conn in list(self.connections):
            counts[conn.security.name] = counts.get(conn.security.name, 0) + 1
        return counts

    def coordinates(self, group_id: str) -> bool:
        """This broker coordinates the group now: it leads the group's offsets partition and holds
        its lease (read before anything is answered from memory)."""
        return self.group_ownership.coordinates(group_id)

    def _fatal(self, message: str) -> None:
        self.fatal_message = message
        self.fatal.set()

    async def stop(self) -> None:
        if self.controller_link is not None:
            await self.controller_link.stop()
        if self._security is not None:
            await self._security.stop()
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
        if self._txn is not None:
            await self._txn.stop()
        await self.connection_gate.close()
        for conn in list(self.connections):
            conn.close()
        self.metrics.close()
        if self.share_dlq is not None:   # its writes end before the partitions close (their records stay
            await self.share_dlq.close()    # ARCHIVING: the next start writes them, once)
        self.group_commit.close()
        if self._groups is not None:
            self._groups.close()   # the last writes, before the directories are let go
        await self.logs.close()
        if self._group_ownership is not None:
            self._group_ownership.close()
        self._release_directories()
        log.info("broker %d stopped", self.node_id)

    def _cleaner(self) -> LogCleaner:
        return LogCleaner(self.config["log.cleaner.enable"], self.config["log.cleaner.dedupe.buffer.size"])

    async def _tick_loop(self) -> None:
        interval = min(self.config["log.retention.check.interval.ms"], 1000) / 1000
        failures = LogLimit(burst=3, period_s=60.0)
        while True:
            await asyncio.sleep(interval)
            try:
                self.group_ownership.reconcile()
                self.groups.expire(consumer_groups=False)
                if self.share_dlq is not None:
                    self.share_dlq.tick()
                await self.groups.consumer.expire_stepwise()
                self.logs.tick(self.now_ms(), flush=self.group_commit.appended)
                self.group_commit.settle_all()
            except OSError as e:
                # a full disk: a line, not a traceback every second
                write, held = failures.allow(time.monotonic())
                if write:
                    log.error("periodic log maintenance failed (%s); will retry%s", e, held_back(held, 60.0))
            except Exception:
                log.exception("periodic log maintenance failed; will retry")

    # ------------------------------------------------------------------ fetch wake-ups
    def data_appended(self) -> None:
        """Wake long-polling fetches: a new event per append so waiters never miss one."""
        event, self._data_event = self._data_event, asyncio.Event()
        event.set()

    async def wait_for_data(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._data_event.wait(), timeout_s)
        except TimeoutError:
            pass


def _started(service: _T | None, what: str) -> _T:
    if service is None:
        raise BrokerNotStarted(f"{what} is made when the broker starts")
    return service


def _advertised_address(bound: Endpoint, advertised: Endpoint, port: int) -> tuple[str, int]:
    if advertised is not bound and advertised != bound:
        return advertised.host, advertised.port or port
    host = bound.host
    return (host if host not in ("", "0.0.0.0", "::") else socket.getfqdn()), port


def _stored_cluster_id(directory: Path) -> str:
    path = directory / "cluster.id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        cid = new_cluster_id()
        path.write_text(cid + "\n")
        return cid
