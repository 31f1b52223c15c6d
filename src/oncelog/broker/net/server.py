"""The broker: one asyncio server, one connection object per client, one handler module per API.

Requests on a connection are handled one at a time and answered in order (Kafka's guarantee, which
idempotent producers rely on): the next request is read meanwhile, but starts only when the one
before it has applied everything (`_Connection`). Bad input costs only the connection that sent it: an oversized frame
is refused from its size prefix, a malformed request or an unsupported version closes the
connection with a log line, and nothing half-applied remains because handlers validate before
they append. A handler that raises is a bug in oncelog, not bad input: it is logged as one and
answered UNKNOWN_SERVER_ERROR (`Broker.handle_request`, the one error boundary).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import socket
import struct
import time
import types
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator
from pathlib import Path
from typing import Any

from oncelog.broker.cluster.controller_client import controller_client
from oncelog.broker.cluster.controller_link import ControllerLink
from oncelog.broker.cluster.producer_id_manager import ProducerIdManager
from oncelog.broker.config import BrokerConfig, ConfigError, new_cluster_id
from oncelog.broker.dynamic_config import DynamicBrokerConfig
from oncelog.broker.groups.consumer_groups import consumer_group_config, topic_metadata
from oncelog.broker.groups.coordinator import GroupCoordinator
from oncelog.broker.groups.ownership import GroupOwnership
from oncelog.broker.handlers import APIS, api_versions
from oncelog.broker.logs.cluster_logs import ClusterLogs
from oncelog.broker.logs.fsync_batcher import GroupCommit
from oncelog.broker.logs.seam import Logs
from oncelog.broker.metrics import BrokerMetrics
from oncelog.broker.net.bind_error import BindError
from oncelog.broker.net.connection_limits import ConnectionGate
from oncelog.broker.net.request_context import APPLIED, CLIENT, LISTENER, MUTE, PRINCIPAL
from oncelog.broker.security.authentication import ConnectionAuth, ListenerSecurity
from oncelog.broker.security.authorization import follow_acls, make_authorizer
from oncelog.broker.security.follower import SecurityFollower
from oncelog.broker.security.inter_broker import ClusterLogin, InterBrokerLink, cluster_credential
from oncelog.broker.security.quotas import BrokerQuotas
from oncelog.broker.security.scram_credentials import ControllerCredentials
from oncelog.broker.txn.coordinator import TxnCoordinatorService
from oncelog.core.security.listeners import Endpoint
from oncelog.core.security.principal import ANONYMOUS, KafkaPrincipal, NoMatchingRule
from oncelog.core.topic_names import is_internal
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey, api_name
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.framing import FrameError, FrameReader
from oncelog.protocol.headers import correlation_id_of, read_request_header, response_header
from oncelog.protocol.primitives import I32
from oncelog.storage.cleaner import LogCleaner
from oncelog.storage.dir_lock import DirectoryLock
from oncelog.storage.group_offsets import GroupOffsetStore
from oncelog.storage.log_manager import LogManager

log = logging.getLogger("oncelog.broker")

_MAX_QUEUED_FRAMES = 64  # stop reading from a client that pipelines more than this
_TLS_HANDSHAKE_TIMEOUT_S = 10.0


class BadRequest(Exception):
    """The request cannot be answered in its own format; the connection is closed."""


class Broker:
    def __init__(self, config: BrokerConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.node_id = self.config["node.id"]
        self._clock = clock
        self.logs: Logs = LogManager(
            self.config.log_dirs, self.config.topic_defaults(), self.config.producer_config(), node_id=self.node_id,
            expiration_check_interval_ms=self.config["producer.id.expiration.check.interval.ms"],
            cleaner=self._cleaner())
        self.producer_ids: ProducerIdManager | None = None
        self.groups: GroupCoordinator | None = None
        self.group_ownership: GroupOwnership | None = None   # who coordinates a group (set by start())
        self.txn: TxnCoordinatorService | None = None
        self.controller_link: ControllerLink | None = None
        self.fatal = asyncio.Event()  # set when the broker must stop (e.g. no cluster rights)
        self.fatal_message = ""
        self.metrics = BrokerMetrics(lambda: self.logs.partitions())
        self.metrics.watch(self)
        self.cluster_id = self.config["cluster.id"]
        self.host, self.port = "", 0
        # per listener name: (host, port) bound and advertised; the first listener is the default
        self.bound: dict[str, tuple[str, int]] = {}
        self.advertised: dict[str, tuple[str, int]] = {}
        self.listener_security: dict[str, ListenerSecurity] = {}
        self.credentials: ControllerCredentials | None = None
        self.inter_broker: InterBrokerLink   # set by start(): how this broker and its peers reach each other
        self.metrics_port: int | None = None
        self._dir_locks: list[DirectoryLock] = []
        self._connections: set[_Connection] = set()
        self._data_event = asyncio.Event()
        self._ticker: asyncio.Task | None = None
        # acks=all answers wait for their fsync; consumers see fsynced records (write.caching=false)
        self.group_commit = GroupCommit(self.now_ms, on_durable=self.data_appended)
        # KIP-890: a partition leader's question to the transaction coordinator before a producer's
        # first transactional batch of a transaction (transactional id, producer id, epoch,
        # partitions, add?) -> code per partition: `broker.txn.add_partitions`, set with the
        # coordinator; None: batches accepted as they come. Transactions V1 batches are only
        # verified with transaction.partition.verification.enable (Kafka's rule)
        self.txn_check: Callable[[str, int, int, list, bool], Awaitable[dict]] | None = None
        self.txn_verification = bool(self.config["transaction.partition.verification.enable"])
        # issue 18: ACLs and client quotas follow the controller's metadata log (security_follower)
        self.authorizer = make_authorizer(self.config)
        self.quotas = BrokerQuotas(self.config, self.now_ms)
        self.security: SecurityFollower | None = None
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
        self.group_ownership = GroupOwnership(self, store)
        self.groups = GroupCoordinator(
            store, self.now_ms,
            c["group.initial.rebalance.delay.ms"], min_session_timeout_ms=c["group.min.session.timeout.ms"],
            max_session_timeout_ms=c["group.max.session.timeout.ms"],
            offsets_retention_ms=c["offsets.retention.minutes"] * 60000,
            offsets_retention_check_interval_ms=c["offsets.retention.check.interval.ms"],
            producer_id_expiration_ms=c["producer.id.expiration.ms"], owns=self.coordinates,
            consumer_groups=consumer_group_config(c),
            topics=lambda: topic_metadata(self.logs.topics, is_internal))
        self.group_ownership.unload = self.groups.unload_partition
        self.inter_broker = InterBrokerLink.from_config(self.config, cluster_credential(self.config))
        await self._bind_listeners()
        if self.config["metrics.port"] >= 0:   # bound before registering: a port in use stops nothing started
            try:
                self.metrics_port = self.metrics.serve(self.config["metrics.host"], self.config["metrics.port"],
                                                       self.config["connections.max.idle.ms"])
            except OSError as e:
                raise BindError("the metrics endpoint", self.config["metrics.host"], self.config["metrics.port"], e,
                                "metrics.port") from e
        await self._connect_controller()
        if self.config["oncelog.cluster"]:
            await self._join_cluster()
            self.dynamic_config.apply()    # the cluster's logs replaced the ones it was applied to
        # Before serving: a partition of __transaction_state left in Prepare* resumes its markers now.
        assert self.producer_ids is not None  # _connect_controller set it or raised
        self.txn = TxnCoordinatorService(self, self.producer_ids.producer_id_nowait)
        self.txn_check = self.txn.partitions.ask
        self.txn.start()
        if isinstance(self.logs, ClusterLogs):   # coordinators follow leadership as promptly as partitions
            self.logs.on_view += [self.group_ownership.reconcile, self.txn.reconcile]
        self.connection_gate.start({name: functools.partial(_Connection, self, sec)
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
        and start TLS per connection (`_Connection`), so a failed handshake is logged with its
        address."""
        setup = self.config.listener_setup
        self.credentials = ControllerCredentials(self)
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
        self.producer_ids = ProducerIdManager(controller_client(self.config), self.node_id,
                                              lambda: link.epoch, on_fatal=self._fatal,
                                              prefetch=self.config["producer.id.block.prefetch"])
        # ACLs and quotas are in force before the first client is served (an empty set with
        # allow.everyone.if.no.acl.found would let anyone in)
        self.security = SecurityFollower(controller_client(self.config),
                                         self.config["broker.heartbeat.interval.ms"])
        self.security.on_change += [lambda state: follow_acls(self.authorizer, state), self.quotas.follow,
                                    self.connection_gate.follow, self.dynamic_config.follow]
        follow_acls(self.authorizer, self.security.state)
        self.quotas.follow(self.security.state)
        self.connection_gate.follow(self.security.state)
        await self.security.catch_up()
        self.security.start()

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
        assert self.group_ownership is not None  # start() made it before serving
        return self.group_ownership.coordinator(group_id)

    def open_connections(self) -> dict[str, int]:
        """Client connections per listener name (every listener, 0 where none)."""
        counts = dict.fromkeys(self.listener_security, 0)
        for conn in list(self._connections):
            counts[conn.security.name] = counts.get(conn.security.name, 0) + 1
        return counts

    def coordinates(self, group_id: str) -> bool:
        """This broker coordinates the group now: it leads the group's offsets partition and holds
        its lease (read before anything is answered from memory)."""
        assert self.group_ownership is not None  # start() made it before serving
        return self.group_ownership.coordinates(group_id)

    def _fatal(self, message: str) -> None:
        self.fatal_message = message
        self.fatal.set()

    async def stop(self) -> None:
        if self.controller_link is not None:
            await self.controller_link.stop()
        if self.security is not None:
            await self.security.stop()
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
        if self.txn is not None:
            await self.txn.stop()
        await self.connection_gate.close()
        for conn in list(self._connections):
            conn.close()
        self.metrics.close()
        self.group_commit.close()
        await self.logs.close()
        if self.group_ownership is not None:
            self.group_ownership.close()
        self._release_directories()
        log.info("broker %d stopped", self.node_id)

    def _cleaner(self) -> LogCleaner:
        return LogCleaner(self.config["log.cleaner.enable"], self.config["log.cleaner.dedupe.buffer.size"])

    async def _tick_loop(self) -> None:
        interval = min(self.config["log.retention.check.interval.ms"], 1000) / 1000
        assert self.groups is not None  # start() makes the coordinator before it starts this loop
        while True:
            await asyncio.sleep(interval)
            try:
                assert self.group_ownership is not None  # made with the group coordinator
                self.group_ownership.reconcile()
                self.groups.expire()
                self.logs.tick(self.now_ms(), flush=self.group_commit.appended)
                self.group_commit.settle_all()
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

    # ------------------------------------------------------------------ requests
    async def handle_request(self, frame: memoryview, peer: str = "", principal: KafkaPrincipal = ANONYMOUS,
                             listener: str = "", mute: Callable[[int], None] | None = None,
                             applied: Callable[[], None] | None = None) -> bytes | None:
        """The framed response to one request, or None when it gets none (Produce with acks=0).

        The one error boundary, as h11 keeps one: bytes that do not make a request we serve
        raise BadRequest (the client's fault: its connection is closed); once decoded, whatever
        a handler raises is ours: a refusal of the whole request (KafkaProtocolError) is
        answered with its code, anything else is a bug, logged as one (`HANDLER_BUG`) and
        answered UNKNOWN_SERVER_ERROR, in the response the request expects."""
        try:
            header = read_request_header(frame)
        except _MALFORMED as e:
            raise BadRequest(f"unreadable request header (correlation id "
                             f"{correlation_id_of(frame)}): {e}") from None
        api_key, version = header.api_key, header.api_version
        api = APIS.get(api_key)
        supported = BROKER_VERSIONS.get(api_key)
        if api is None or supported is None:
            raise BadRequest(f"unknown API key {api_key} from client {header.client_id!r}")
        if not supported[0] <= version <= supported[1]:
            if api_key == ApiKey.API_VERSIONS:
                return _framed(I32.pack(header.correlation_id), api_versions.unsupported_version())
            raise BadRequest(f"{api_name(api_key)} v{version} is not supported "
                             f"(this broker serves v{supported[0]}-v{supported[1]})")
        started = time.perf_counter()
        refused: int = ErrorCode.NONE
        try:
            request = api.decode(version, frame[header.body_offset:])
        except _MALFORMED as e:
            raise BadRequest(f"malformed {api_name(api_key)} v{version} request "
                             f"(correlation id {header.correlation_id}): {e}") from None
        CLIENT.set((header.client_id, peer))
        MUTE.set(mute)
        APPLIED.set(applied)
        PRINCIPAL.set(principal)
        LISTENER.set(listener)
        try:
            handling = api.handle(self, version, request)
            body = await (self.quotas.handle_timed(handling) if self.quotas.request.overrides else handling)
        except KafkaProtocolError as e:
            log.info("%s v%d from %s refused: %s", api_name(api_key), version, peer or "?", e)
            refused = e.code
            body = api.error_response(version, request, e.code)
        except Exception:
            log.exception("%s %s v%d (correlation id %d, client %r at %s); answered UNKNOWN_SERVER_ERROR",
                          HANDLER_BUG, api_name(api_key), version, header.correlation_id, header.client_id,
                          peer or "?")
            self.metrics.handler_bugs.inc()
            refused = ErrorCode.UNKNOWN_SERVER_ERROR
            body = api.error_response(version, request, refused)
        if body is not None:
            if api_key not in _ERRORS_COUNTED_BY_HANDLER:
                self.metrics.count_response_errors(api_key, version, body)
            elif refused:
                self.metrics.count_errors(api_name(api_key), (refused,))
        response = None if body is None else _framed(
            response_header(api_key, version, header.correlation_id), body)
        self.metrics.observe(api_key, len(frame), len(response) if response else 0,
                             time.perf_counter() - started)
        return response


# Produce and Fetch count their partitions' errors as they build their answers (the hot path: their
# responses are not read back); every other response's errors are counted from its bytes
_ERRORS_COUNTED_BY_HANDLER = frozenset({ApiKey.PRODUCE, ApiKey.FETCH})

# What a handler bug's log line starts with: tests fail when a broker logged one
# (tests/conftest.py, oncelog.testing.handler_bugs).
HANDLER_BUG = "handler bug in"

# What a decoder raises on bytes that do not make the request they claim to be.
_MALFORMED = (ValueError, IndexError, TypeError, UnicodeDecodeError, EOFError, OverflowError, struct.error)


def _start(request: Coroutine[Any, Any, bytes | None]) -> tuple[bool, Any]:
    """Runs a request's coroutine until it first waits: (True, its response) if it never does,
    else (False, a task running the rest). Most requests never wait, and answering them here,
    without a task, saves most of a small request's latency (a task costs a trip through the
    event loop); a Produce appends here, in arrival order, even when its answer then waits for
    an fsync. Raises what the coroutine raises before it waits."""
    try:
        waiting_on = request.send(None)
    except StopIteration as done:
        return True, done.value
    return False, asyncio.ensure_future(_resume(request, waiting_on))


@types.coroutine
def _resume(request: Coroutine[Any, Any, Any], waiting_on: Any) -> Generator[Any, Any, Any]:
    """The rest of a coroutine `_start` ran by hand, for a task: the task first waits for what
    the coroutine yielded (a future, as `await` yields it), then drives it as it would have
    from the start. What the task throws in (a cancellation) goes to the coroutine."""
    while True:
        try:
            yield waiting_on
        except BaseException as exc:  # noqa: BLE001 - not caught: thrown into the coroutine, which re-raises what it does not handle
            try:
                waiting_on = request.throw(exc)
            except StopIteration as done:
                return done.value
            continue
        return (yield from request)


def _advertised_address(bound: Endpoint, advertised: Endpoint, port: int) -> tuple[str, int]:
    if advertised is not bound and advertised != bound:
        return advertised.host, advertised.port or port
    host = bound.host
    return (host if host not in ("", "0.0.0.0", "::") else socket.getfqdn()), port


def _framed(header: bytes, body: bytes) -> bytes:
    return b"".join((I32.pack(len(header) + len(body)), header, body))


def _stored_cluster_id(directory: Path) -> str:
    path = directory / "cluster.id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        cid = new_cluster_id()
        path.write_text(cid + "\n")
        return cid


def _is_produce(frame: memoryview) -> bool:
    # Only a Produce starts while answers before it wait for their fsync: any other request (a
    # Fetch reading what the Produce wrote) sees the connection's earlier requests answered.
    return len(frame) >= 2 and frame[0] == 0 and frame[1] == ApiKey.PRODUCE


class _Connection(asyncio.BufferedProtocol):
    """Requests are applied one at a time, in order, and answered in order, as Kafka's socket
    server mutes a channel until its response is sent: a request that waits (a long-poll Fetch, a
    JoinGroup, a Produce's KIP-890 verification by another broker) holds up the requests behind
    it, which are read meanwhile. The one exception: a Produce that has appended everything and
    only waits for its fsync (it calls `request_context.applied()` before it first waits) lets
    the Produce requests behind it start, so that their appends join the same group commit; its
    answer still goes out first. Any other request waits until every answer before it is out."""

    def __init__(self, broker: Broker, security: ListenerSecurity) -> None:
        self.broker = broker
        self.security = security
        self.auth: ConnectionAuth = None  # type: ignore[assignment]  # set once the connection is established
        self.decoder = FrameReader(broker.config["socket.request.max.bytes"])
        # the reader's own method as the protocol's: asyncio calls it once per read, with no hop between
        self.get_buffer = self.decoder.get_buffer  # type: ignore[method-assign]
        self.queue: deque[memoryview] = deque()
        self.outbox: deque = deque()  # answers in request order: bytes, or tasks still waiting
        self.outbox_empty = asyncio.Event()
        self.outbox_empty.set()
        # None until connection_made, which asyncio calls before any other callback
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.peer = "?"
        self.peer_host = ""
        self.worker: asyncio.Task | None = None
        self.wakeup = asyncio.Event()
        self.reading_paused = False
        self.closing = False
        self.busy = False
        self.current: asyncio.Future | None = None  # the waiting request that holds up the ones behind it
        self.only_answer_waits = False  # the request just started called request_context.applied()
        self.muted = False            # KIP-219: no reads while a quota throttle lasts
        self._muted_until = 0.0
        self.listener = security.name
        self.last_active = time.monotonic()   # connections.max.idle.ms counts from here

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = f"/{peer[0]}" if peer else ""
        self.broker._connections.add(self)
        tls = self.security.tls
        if tls is None:
            self._established(transport)
            return
        # start_tls must take the socket before connection_made returns: uvloop starts reading as
        # soon as it does, and a ClientHello read here would be taken for a request frame.
        # `_start` runs the coroutine up to its first wait, which is past start_tls's switch.
        _done, self.worker = _start(self._start_tls(transport, tls.context))

    async def _start_tls(self, raw, context) -> None:
        try:
            tls_transport = await asyncio.get_running_loop().start_tls(
                raw, self, context, server_side=True, ssl_handshake_timeout=_TLS_HANDSHAKE_TIMEOUT_S)
        except (OSError, TimeoutError, ConnectionError, ValueError) as e:
            log.warning("TLS handshake failed from %s on %s: %s", self.peer, self.security.name,
                        getattr(e, "reason", None) or e or type(e).__name__)
            self.broker.metrics.connections_closed.inc()
            raw.close()
            self._gone()
            return
        if self.closing or tls_transport is None:
            return
        self._established(tls_transport)
        await self._work()

    def _established(self, transport) -> None:
        self.transport = transport
        self.auth = ConnectionAuth(self.security, self.peer)
        tls = self.security.tls
        if tls is not None and not self.security.protocol.uses_sasl:
            try:
                self.auth.principal = tls.principal(transport.get_extra_info("ssl_object"))
            except NoMatchingRule as e:
                log.warning("closing connection from %s on %s: no ssl.principal.mapping.rules rule maps the "
                            "certificate name: %s", self.peer, self.security.name, e)
                self.close()
                return
        self._apply_receive_limit()
        if self.worker is None:
            self.worker = asyncio.create_task(self._work())

    def _apply_receive_limit(self) -> None:
        """Frames before authentication are capped at sasl.server.max.receive.size."""
        limit = self.auth.receive_limit
        full = self.broker.config["socket.request.max.bytes"]
        self.decoder.max_size = full if limit is None else min(limit, full)
        self.decoder.limit_name = "socket.request.max.bytes" if limit is None else "sasl.server.max.receive.size"

    def buffer_updated(self, nbytes: int) -> None:
        if self.closing:
            return
        self.last_active = time.monotonic()
        try:
            frames = self.decoder.buffer_updated(nbytes)
        except FrameError as e:
            self._refuse(str(e))
            return
        now = self.broker.now_ms()
        for frame in frames:
            if self.busy or self.queue or not self._may_start(frame) or self.auth.intercepts(frame, now):
                self.queue.append(frame)
                continue
            try:
                answered, result = _start(self._handle(frame))
            except BadRequest as e:
                self._refuse(str(e))
                return
            except Exception:  # noqa: BLE001 - a handler bug: logged, the connection closed, the broker stays up
                self._internal_error()
                return
            if answered:
                self._send(result)
            elif self.only_answer_waits:
                self._pipeline(result)
            else:
                self.busy = True
                self.current = result
                self.wakeup.set()
        if len(self.queue) >= _MAX_QUEUED_FRAMES and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        if self.queue:
            self.wakeup.set()

    def _may_start(self, frame: memoryview) -> bool:
        return not self.outbox or (_is_produce(frame) and len(self.outbox) < _MAX_QUEUED_FRAMES)

    def _send(self, response: bytes | None) -> None:
        if response is None or self.closing:
            return
        if self.outbox:
            self.outbox.append(response)
        else:
            self.transport.write(response)

    def _pipeline(self, task: asyncio.Future) -> None:
        self.outbox.append(task)
        self.outbox_empty.clear()
        task.add_done_callback(self._flush_outbox)

    def _flush_outbox(self, _task=None) -> None:
        """Write the answers at the head of the outbox that are ready, in order."""
        while self.outbox:
            head = self.outbox[0]
            if isinstance(head, asyncio.Future):
                if not head.done():
                    return
                self.outbox.popleft()
                if head.cancelled():
                    continue
                try:
                    response = head.result()
                except BadRequest as e:
                    self._refuse(str(e))
                    return
                except Exception:  # noqa: BLE001 - as above
                    self._internal_error()
                    return
            else:
                response = self.outbox.popleft()
            if response is not None and not self.closing:
                self.transport.write(response)
        self.outbox_empty.set()
        if self.queue:
            self.wakeup.set()

    def mute(self, ms: int) -> None:
        """KIP-219: stop reading for `ms` (the throttled answer still goes out)."""
        if self.closing:
            return
        if not self.muted:
            self.muted = True
            self.transport.pause_reading()
        loop = asyncio.get_running_loop()
        until = loop.time() + ms / 1000
        if until > self._muted_until:
            self._muted_until = until
            loop.call_at(until, self._unmute, until)

    def _unmute(self, until: float) -> None:
        if self.closing or not self.muted or until != self._muted_until:
            return
        self.muted = False
        if not self.reading_paused:
            self.transport.resume_reading()


    def _handle(self, frame: memoryview) -> Coroutine[Any, Any, bytes | None]:
        self.only_answer_waits = False
        return self.broker.handle_request(frame, self.peer_host, self.auth.principal, self.security.name,
                                          self.mute, self._applied)

    def _applied(self) -> None:
        self.only_answer_waits = True

    async def _authenticate(self, frame: memoryview) -> bool:
        """A frame the authenticator takes; True when it is a request to handle after all."""
        outcome = await self.auth.take(frame, self.broker.now_ms(), self._handle)
        self._apply_receive_limit()
        if outcome.handle:
            return True
        if outcome.response is not None and not self.closing:
            self.transport.write(outcome.response)
        if outcome.close:
            self.broker.metrics.connections_closed.inc()
            self.close()
        elif outcome.close_after_ms:
            # the answer goes out now; the close waits (Kafka's failed-authentication delay)
            self.closing = True
            self.queue.clear()
            self.transport.pause_reading()
            self.broker.metrics.connections_closed.inc()
            asyncio.get_running_loop().call_later(outcome.close_after_ms / 1000, self.close)
        return False

    def connection_lost(self, exc) -> None:
        self._gone()

    def _gone(self) -> None:
        self.broker.connection_gate.release(self)
        self.closing = True
        self.broker._connections.discard(self)
        self.wakeup.set()

    def _refuse(self, why: str) -> None:
        log.warning("closing connection from %s: %s", self.peer, why)
        self.broker.metrics.connections_closed.inc()
        self.close()

    def handling(self) -> bool:
        """A request of this connection is being handled or waits its turn (not idle)."""
        return self.busy or bool(self.queue) or bool(self.outbox)

    def close_idle(self, idle_ms: int) -> None:
        principal = self.auth.principal if self.auth is not None else ANONYMOUS
        log.info("closing idle connection of %s from %s on %s: nothing received for %d ms "
                 "(connections.max.idle.ms)", principal, self.peer, self.listener, idle_ms)
        self.close()

    def close(self) -> None:
        self.closing = True
        self.queue.clear()
        if self.transport is not None:
            self.transport.close()
        self.wakeup.set()
        self.outbox_empty.set()

    def _internal_error(self) -> None:
        log.exception("internal error handling a request from %s; closing that connection", self.peer)
        self.broker.metrics.connections_closed.inc()
        self.close()

    async def _work(self) -> None:
        """Runs requests that wait, and whatever arrived behind them, in order."""
        while not self.closing:
            if self.current is None and not self.queue:
                self.busy = False
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            self.busy = True
            try:
                if self.current is not None:
                    pending, self.current = self.current, None
                    response = await pending
                else:
                    if not self._may_start(self.queue[0]):
                        await self.outbox_empty.wait()  # answers before it go out first
                        continue
                    frame = self.queue.popleft()
                    if self.reading_paused and len(self.queue) < _MAX_QUEUED_FRAMES // 2:
                        self.reading_paused = False
                        if not self.muted:
                            self.transport.resume_reading()
                    if self.auth.intercepts(frame, self.broker.now_ms()) and not await self._authenticate(frame):
                        continue
                    answered, response = _start(self._handle(frame))
                    if not answered:
                        if self.only_answer_waits:
                            self._pipeline(response)
                            continue
                        response = await response
            except BadRequest as e:
                self._refuse(str(e))
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a handler bug: logged, the connection closed, the broker stays up
                self._internal_error()
                return
            self._send(response)
