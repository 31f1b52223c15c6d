"""The controller: owns cluster metadata (producer-id blocks, broker registrations, topics and
partition leaders) in its metadata log and serves it on its own listener, in Kafka's request
format, to authenticated brokers and admin tools.

Every change is decided by a pure function (core.controller_state, core.leadership), appended and
fsynced, then replayed; the reply goes out only after that, so a reply never describes state a
crash could lose. An append that fails (a full disk, a failed fsync) leaves nothing in the log and
changes no state: the caller gets KAFKA_STORAGE_ERROR (retriable; a broker backs off and asks
again). Kafka's controller answers such faults with an error and reverts to its last committed
offset; here the log itself is cut back to it. A log that cannot even be cut back refuses every
change until a restart, and `fatal` is set so a standalone controller exits. Callers authenticate
with SASL/SCRAM-SHA-512 (brokers and oncelog's tools: the server proves it holds the verifier),
SCRAM-SHA-256 or PLAIN; only principals with cluster rights may register, allocate ids or change
topics (others get CLUSTER_AUTHORIZATION_FAILED).
Liveness: a broker that misses heartbeats for `broker.session.timeout.ms` is considered dead and
its partitions get new leaders (with a higher leader epoch).
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import ssl
import time
import uuid
from dataclasses import dataclass, field

from oncelog.controller import scram
from oncelog.controller.connection_limits import ConnectionLimits, Idle, Refused, read_frame
from oncelog.controller.security import ControllerSecurity
from oncelog.core.controller_state import BROKER, PID_BLOCK, ControllerState, TokenBucket
from oncelog.core.leadership import NO_LEADER, Leadership
from oncelog.core.security.credentials import ScramCredentials
from oncelog.core.security.plain import MECHANISM as PLAIN
from oncelog.core.security.plain import PlainServer
from oncelog.core.security.sasl import AuthenticationFailed, IllegalSaslState, SaslServerMechanism
from oncelog.core.security.scram import (
    DEFAULT_ITERATIONS,
    AddScram,
    ScramCredential,
    ScramMechanism,
    ScramServer,
    credential_from_password,
)
from oncelog.core.topic_config import parse_topic_configs
from oncelog.protocol import entities
from oncelog.protocol import metadata as md
from oncelog.protocol.api import CONTROLLER_VERSIONS, SECURITY_RECORDS_KEY, ApiKey, api_name
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.headers import read_request_header, response_header
from oncelog.protocol.primitives import I16, I32
from oncelog.storage.metadata_log import MetadataLog, MetadataLogError

log = logging.getLogger("oncelog.controller")

SNAPSHOT_EVERY = 1000
BROKER_RESOURCE = 4  # Kafka's ConfigResource.Type.BROKER
TAG_TOPIC_OVERRIDES = 10001  # controller -> broker Metadata: a topic's config overrides as JSON
_OPEN_APIS = {ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}
# what brokers follow (leaders, topics; ACLs, quotas and every SCRAM verifier): the cluster
# principal's alone; anyone else asking is closed on
_CLUSTER_FEEDS = {ApiKey.METADATA, SECURITY_RECORDS_KEY}
# SCRAM first: the server proves it holds the user's verifier, so a client that checks the proof
# (every oncelog link does) hands no reusable secret to whoever listens on the controller's port
# (a local user who bound it while the controller was down). PLAIN stays for other tools.
CONTROLLER_MECHANISMS = (ScramMechanism.SCRAM_SHA_512.mechanism_name, ScramMechanism.SCRAM_SHA_256.mechanism_name,
                         PLAIN)


@dataclass
class ControllerConfig:
    metadata_dir: str
    host: str = "127.0.0.1"
    port: int = 0
    users: dict[str, str] = field(default_factory=dict)      # SASL/PLAIN user -> password
    cluster_principals: set[str] = field(default_factory=set)  # users with cluster rights
    session_timeout_ms: int = 3000
    producer_id_floor: int = 0
    allocations_per_s: float = 200.0
    allocation_burst: int = 50
    bootstrap_scram: list[AddScram] = field(default_factory=list)  # `--add-scram`: applied to a new log only
    ssl_context: ssl.SSLContext | None = None   # TLS on the controller listener (brokers then need its CA)
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)   # pre-auth size, idle, failed-login delay


class Controller:
    def __init__(self, config: ControllerConfig, clock=time.time) -> None:
        self.config = config
        self._clock = clock
        self.log = MetadataLog(config.metadata_dir)
        self.state = ControllerState()
        self.leadership = Leadership()
        self.security = ControllerSecurity(self.log, self._commit)
        self._load()
        self.live: dict[int, int] = {}  # broker id -> last heartbeat (ms)
        self.rate = TokenBucket(config.allocations_per_s, config.allocation_burst)
        self._server: asyncio.base_events.Server | None = None
        self._watch: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._view_stale = False  # a brokers-changed decision could not be committed: retry it
        self.fatal = asyncio.Event()  # the metadata log is unusable: a standalone controller exits
        self.fatal_message = ""
        self.address: tuple[str, int] = ("", 0)
        # the controller's users' SCRAM verifiers, derived from their passwords once per start
        self._verifiers: dict[tuple[ScramMechanism, str], ScramCredential] = {
            (m, user): credential_from_password(m, password, secrets.token_bytes(32), DEFAULT_ITERATIONS)
            for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
            for user, password in config.users.items()}
        self._mock_secret = secrets.token_bytes(32)
        bootstrap = scram.bootstrap(self.scram, config.bootstrap_scram, self.log)  # only while the log is new
        self._commit(self.state.decide_floor(config.producer_id_floor))
        self._commit(bootstrap)

    @property
    def scram(self) -> ScramCredentials:
        """SCRAM credentials live with the other security records (one replay, one snapshot)."""
        return self.security.state.scram

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # ------------------------------------------------------------------ state
    def _load(self) -> None:
        start = 0
        snap = self.log.latest_snapshot()
        if snap is not None:
            start, data = snap
            self.state = ControllerState.from_snapshot(data["producer_ids"])
            for r in data["leadership"]:
                self.leadership.replay(r)
            self.security.load_snapshot(data.get("security"), start)
        for offset, record in self.log.read(start):
            self._replay(record, offset)
        log.info("controller state: next producer id %d, %d brokers, %d topics, metadata log at %d",
                 self.state.next_producer_id, len(self.state.brokers), len(self.leadership.topics),
                 self.log.end_offset)

    def _replay(self, record: dict, offset: int) -> None:
        if self.security.replay(record, offset):
            return
        if record["type"] in (PID_BLOCK, BROKER):
            self.state.replay(record)
        else:
            self.leadership.replay(record)

    def _commit(self, records: list[dict]) -> None:
        """Append + fsync, then replay: the only way state changes. Raises KAFKA_STORAGE_ERROR
        (nothing appended, nothing changed) when the records could not be made durable."""
        if not records:
            return
        before = self.log.end_offset
        try:
            self.log.append(records)
        except MetadataLogError as e:
            log.error("controller: %s", e)
            if self.log.failed and not self.fatal_message:
                self.fatal_message = f"metadata log failed: {self.log.failed}"
                self.fatal.set()
                log.critical("controller: %s; every change is refused until a restart", self.fatal_message)
            raise KafkaProtocolError(ErrorCode.KAFKA_STORAGE_ERROR, str(e)) from None
        for i, r in enumerate(records, start=before):
            self._replay(r, i)
        if self.log.end_offset // SNAPSHOT_EVERY > before // SNAPSHOT_EVERY:
            try:
                self.snapshot()
            except OSError as e:  # the log holds everything: a snapshot only shortens replay
                log.warning("controller: metadata snapshot failed (%s); will try at the next one", e)

    def snapshot(self) -> None:
        records = []
        for t in self.leadership.topics.values():
            records.append({"type": "topic", "name": t.name, "topic_id": t.topic_id,
                            "partitions": t.partitions, "overrides": t.overrides})
        for (topic, p), (leader, epoch) in sorted(self.leadership.leaders.items()):
            records.append({"type": "leader", "topic": topic, "partition": p, "leader": leader, "epoch": epoch})
        self.log.write_snapshot(self.log.end_offset, {"producer_ids": self.state.to_snapshot(),
                                                       "leadership": records,
                                                       "security": self.security.state.to_snapshot()})

    def live_brokers(self) -> list[int]:
        return sorted(self.live)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, self.config.host, self.config.port,
                                                  ssl=self.config.ssl_context)
        self.address = self._server.sockets[0].getsockname()[:2]
        self._watch = asyncio.create_task(self._watch_liveness())
        log.info("controller accepts brokers on %s:%d", *self.address)
        return self.address

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        try:
            self.snapshot()
        except OSError as e:
            # a full disk at shutdown: every record is in the log, which the next start replays
            log.error("controller: no snapshot at stop (%s): the next start replays the metadata log",
                      e.strerror or e)
        self.log.close()

    async def _watch_liveness(self) -> None:
        interval_s = min(0.25, self.config.session_timeout_ms / 4000)
        last = time.monotonic()
        while True:
            await asyncio.sleep(interval_s)
            tick = time.monotonic()
            stalled_ms, last = (tick - last - interval_s) * 1000, tick
            now = self.now_ms()
            if stalled_ms > 0:
                # The controller itself did not run for that long (paused, a stalled VM, a loaded
                # machine): the brokers' heartbeats of that time wait in its sockets, unread. That
                # silence is its own, so it is credited to every broker instead of every partition
                # losing its leader at once when it resumes.
                if stalled_ms > self.config.session_timeout_ms / 4:
                    log.warning("the controller did not run for %d ms: every broker's session is extended by it",
                                stalled_ms)
                for b in self.live:
                    self.live[b] = min(now, self.live[b] + int(stalled_ms))
            dead = [b for b, seen in self.live.items() if now - seen > self.config.session_timeout_ms]
            for b in dead:
                del self.live[b]
                log.warning("broker %d missed heartbeats for %d ms: moving its partitions", b,
                            self.config.session_timeout_ms)
            if dead or self._view_stale:
                async with self._lock:
                    self._commit_brokers_changed()

    def _commit_brokers_changed(self) -> None:
        """Leaders for the live brokers; when that cannot be committed now, the liveness watch
        tries again (nothing else would: the broker set may not change again)."""
        try:
            self._commit(self.leadership.decide_brokers_changed(self.live_brokers()))
            self._view_stale = False
        except KafkaProtocolError:
            self._view_stale = True

    # ------------------------------------------------------------------ connections
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        address = writer.get_extra_info("peername")
        peer = f"{address[0]}:{address[1]}" if address else "?"
        principal: str | None = None
        mechanism: SaslServerMechanism | None = None   # chosen by the handshake
        limits = self.config.limits
        try:
            while True:
                frame = await read_frame(reader, limits, authenticated=principal is not None)
                h = read_request_header(frame)
                if h.api_key in _CLUSTER_FEEDS and principal is not None \
                        and principal not in self.config.cluster_principals:
                    log.warning("controller: %s from %r at %s, who is not the cluster principal: closing",
                                _feed_name(h.api_key), principal, peer)
                    return
                if h.api_key == SECURITY_RECORDS_KEY and principal is not None:
                    answer = self.security.follow(frame[h.body_offset:])
                    writer.write(_framed(response_header(h.api_key, h.api_version, h.correlation_id), answer))
                    await writer.drain()
                    continue
                versions = CONTROLLER_VERSIONS.get(h.api_key)
                if versions is None or not versions[0] <= h.api_version <= versions[1]:
                    if h.api_key == ApiKey.API_VERSIONS:
                        refusal = I16.pack(ErrorCode.UNSUPPORTED_VERSION) + self._version_list()
                        writer.write(_framed(I32.pack(h.correlation_id), refusal))
                        continue
                    log.warning("controller: %s v%d from %s is not served, closing",
                                api_name(h.api_key), h.api_version, peer)
                    return
                body = frame[h.body_offset:]
                if h.api_key not in _OPEN_APIS and principal is None:
                    log.warning("controller: %s from unauthenticated %s, closing", api_name(h.api_key), peer)
                    return
                failed = False
                if h.api_key == ApiKey.SASL_HANDSHAKE:
                    if mechanism is not None or principal is not None:
                        return   # one exchange per connection
                    answer, mechanism = self._sasl_handshake(h.api_version, body)
                    failed = mechanism is None
                elif h.api_key == ApiKey.SASL_AUTHENTICATE:
                    if mechanism is None or principal is not None:
                        return
                    answer, failed = self._sasl_authenticate(h.api_version, body, peer, mechanism)
                    if mechanism.complete:
                        principal = mechanism.authorization_id
                else:
                    answer = await self._handle(h.api_key, h.api_version, body, principal)
                if failed:
                    # KIP-306: the failure answer itself waits connection.failed.authentication.delay.ms
                    # (a guesser learns nothing sooner), then the connection closes
                    await asyncio.sleep(limits.failed_authentication_delay_ms / 1000)
                writer.write(_framed(response_header(h.api_key, h.api_version, h.correlation_id), answer))
                await writer.drain()
                if failed:
                    return
        except Idle as e:
            log.debug("controller: closing connection from %s%s: %s", peer,
                      f" ({principal})" if principal else "", e)
        except Refused as e:
            log.warning("controller: closing connection from %s%s: %s", peer,
                        f" ({principal})" if principal else "", e)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the peer went away, or the controller is stopping
        except entities.MalformedRequest as e:
            log.warning("controller: malformed request from %s: %s", peer, e)
        except Exception:
            log.exception("controller: internal error on a request from %s; closing that connection", peer)
        finally:
            writer.close()

    def _version_list(self) -> bytes:
        out = [I32.pack(len(CONTROLLER_VERSIONS))]
        for k, (lo, hi) in sorted(CONTROLLER_VERSIONS.items()):
            out.append(I16.pack(k) + I16.pack(lo) + I16.pack(hi))
        return b"".join(out)

    def _sasl_handshake(self, version: int, body) -> tuple[bytes, SaslServerMechanism | None]:
        """The answer, and the exchange it starts (None: refused, the connection then closes
        after the delay)."""
        r = entities.decode_request(ApiKey.SASL_HANDSHAKE, version, body)
        mechanism: SaslServerMechanism | None = None
        scram = ScramMechanism.from_name(str(r.mechanism))
        if r.mechanism == PLAIN:
            mechanism = PlainServer(self.config.users)   # constant-time comparison, unknown users included
        elif scram is not None:
            mechanism = ScramServer(scram, lambda user: self._verifiers.get((scram, user)), secrets.token_bytes,
                                    self._mock_secret)
        else:
            log.warning("controller: unsupported SASL mechanism %r", r.mechanism)
        code = ErrorCode.NONE if mechanism is not None else ErrorCode.UNSUPPORTED_SASL_MECHANISM
        return (entities.ResponseBuilder(ApiKey.SASL_HANDSHAKE, version).encode(
            error_code=code, mechanisms=CONTROLLER_MECHANISMS), mechanism)

    def _sasl_authenticate(self, version: int, body, peer: str,
                           mechanism: SaslServerMechanism) -> tuple[bytes, bool]:
        """The answer to one token, and whether the exchange failed."""
        r = entities.decode_request(ApiKey.SASL_AUTHENTICATE, version, body)
        rb = entities.ResponseBuilder(ApiKey.SASL_AUTHENTICATE, version)
        try:
            challenge = mechanism.evaluate(bytes(r.auth_bytes))
        except (AuthenticationFailed, IllegalSaslState) as e:
            log.warning("controller: SASL/%s authentication failed for %r: %s (from %s)", mechanism.mechanism,
                        getattr(e, "user", None), e, peer)
            return rb.encode(error_code=ErrorCode.SASL_AUTHENTICATION_FAILED,
                             error_message="authentication failed: invalid username or password",
                             auth_bytes=b"", session_lifetime=0), True
        return rb.encode(error_code=ErrorCode.NONE, error_message=None, auth_bytes=challenge, session_lifetime=0), False

    # ------------------------------------------------------------------ requests
    async def _handle(self, api_key: int, version: int, body: memoryview, principal: str | None) -> bytes:
        r = entities.decode_request(api_key, version, body)
        rb = entities.ResponseBuilder(api_key, version)
        authorized = principal in self.config.cluster_principals
        if api_key == ApiKey.API_VERSIONS:
            entry = lambda k, lo, hi: rb("ApiVersion", api_key=k, min_version=lo, max_version=hi)  # noqa: E731
            return rb.encode(error_code=0, api_keys=tuple(entry(k, *v) for k, v in sorted(CONTROLLER_VERSIONS.items())),
                             throttle_time=0, supported_features=(), finalized_features_epoch=-1,
                             finalized_features=(), zk_migration_ready=False)
        assert principal is not None  # the other APIs need an authenticated connection (serve checks)
        async with self._lock:
            if api_key == ApiKey.ALLOCATE_PRODUCER_IDS:
                return self._allocate(rb, r, principal, authorized)
            if api_key == ApiKey.BROKER_REGISTRATION:
                return self._register(rb, r, authorized)
            if api_key == ApiKey.BROKER_HEARTBEAT:
                return self._heartbeat(rb, r, authorized)
            if api_key == ApiKey.METADATA:
                return self._metadata(version)
            if api_key == ApiKey.CREATE_TOPICS:
                return self._create_topics(rb, r, authorized)
            if api_key == ApiKey.DELETE_TOPICS:
                return self._delete_topics(rb, r, authorized)
            if api_key == ApiKey.CREATE_PARTITIONS:
                return self._create_partitions(rb, r, authorized)
            if api_key == ApiKey.INCREMENTAL_ALTER_CONFIGS:
                return self._alter_configs(rb, r, authorized)
            if api_key == ApiKey.ALTER_PARTITION_REASSIGNMENTS:
                return self._reassign(rb, r, authorized)
            if api_key == ApiKey.CREATE_ACLS:
                return self.security.create_acls(rb, r, authorized)
            if api_key == ApiKey.DELETE_ACLS:
                return self.security.delete_acls(rb, r, authorized)
            if api_key == ApiKey.ALTER_CLIENT_QUOTAS:
                return self.security.alter_client_quotas(rb, r, authorized)
            if api_key == ApiKey.UPDATE_FEATURES:
                return self._update_features(rb, r, authorized)
            if api_key in (ApiKey.ALTER_USER_SCRAM_CREDENTIALS, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS):
                if not authorized:
                    return rb.encode_error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
                if api_key == ApiKey.ALTER_USER_SCRAM_CREDENTIALS:
                    return scram.alter(self.scram, rb, r, self._commit)
                return scram.describe_with_records(self.scram, rb, r)
        raise entities.MalformedRequest(f"{api_name(api_key)} is not served by the controller")

    def _allocate(self, rb, r, principal: str, authorized: bool) -> bytes:
        fail = dict(throttle_time=0, producer_id_start=-1, producer_id_len=0)
        if not authorized:
            log.warning("controller: %r has no cluster rights: AllocateProducerIds refused", principal)
            return rb.encode(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, **fail)
        throttle = self.rate.take(principal, self.now_ms())
        if throttle:
            return rb.encode(error_code=ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                             **{**fail, "throttle_time": throttle})
        try:
            records, block = self.state.decide_allocate(int(r.broker_id), int(r.broker_epoch))
            self._commit(records)
        except KafkaProtocolError as e:
            return rb.encode(error_code=e.code, **fail)
        log.info("controller: producer ids %d..%d to broker %d (epoch %d)", block.first, block.last,
                 block.broker_id, int(r.broker_epoch))
        return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, producer_id_start=block.first,
                         producer_id_len=block.size)

    def _register(self, rb, r, authorized: bool) -> bytes:
        if not authorized:
            return rb.encode(throttle_time=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, broker_epoch=-1)
        listener = r.listeners[0] if r.listeners else None
        records, epoch = self.state.decide_register(int(r.broker_id), listener.host if listener else "",
                                                    int(listener.port) if listener else -1)
        try:
            self._commit(records)
        except KafkaProtocolError as e:
            return rb.encode(throttle_time=0, error_code=e.code, broker_epoch=-1)
        self.live[int(r.broker_id)] = self.now_ms()
        self._commit_brokers_changed()
        log.info("controller: broker %d registered with epoch %d at %s:%s", int(r.broker_id), epoch,
                 listener.host if listener else "?", listener.port if listener else "?")
        return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, broker_epoch=epoch)

    def _heartbeat(self, rb, r, authorized: bool) -> bytes:
        flags = dict(throttle_time=0, is_caught_up=True, is_fenced=False, should_shut_down=False)
        if not authorized:
            return rb.encode(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, **flags)
        try:
            self.state.check_broker_epoch(int(r.broker_id), int(r.broker_epoch))
        except KafkaProtocolError as e:
            return rb.encode(error_code=e.code, **{**flags, "is_fenced": True})
        first = int(r.broker_id) not in self.live
        self.live[int(r.broker_id)] = self.now_ms()
        if first:
            self._commit_brokers_changed()
        return rb.encode(error_code=ErrorCode.NONE, **flags)

    def _metadata(self, version: int) -> bytes:
        brokers = [md.BrokerEntry(b.broker_id, b.host, b.port) for b in self.state.brokers.values()
                   if b.broker_id in self.live]
        topics = []
        for t in self.leadership.topics.values():
            parts = []
            for p in range(t.partitions):
                leader, epoch = self.leadership.leaders.get((t.name, p), (NO_LEADER, 0))
                parts.append(md.PartitionEntry(p, 0 if leader != NO_LEADER else ErrorCode.LEADER_NOT_AVAILABLE,
                                               leader, epoch))
            entry = md.TopicEntry(t.name, 0, uuid.UUID(t.topic_id), tuple(parts))
            entry.extra_tags = {TAG_TOPIC_OVERRIDES: json.dumps(t.overrides).encode()}
            topics.append(entry)
        return md.encode_response(version, brokers, None, -1, topics)

    def _check(self, authorized: bool) -> None:
        if not authorized:
            raise KafkaProtocolError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "no cluster rights")

    def _create_topics(self, rb, r, authorized: bool) -> bytes:
        results = []
        for t in r.topics:
            try:
                self._check(authorized)
                overrides = {c.name: c.value for c in t.configs if c.value is not None}
                parse_topic_configs(overrides)
                n = int(t.num_partitions)
                if n < 1:
                    raise KafkaProtocolError(ErrorCode.INVALID_PARTITIONS, f"{n} partitions")
                topic_id = uuid.uuid4()
                records = self.leadership.decide_create_topic(str(t.name), str(topic_id), n, overrides,
                                                              self.live_brokers())
                if not r.validate_only:
                    self._commit(records)
                results.append(rb("CreatableTopicResult", name=t.name, topic_id=topic_id, error_code=0,
                                  error_message=None, num_partitions=n, replication_factor=1, configs=None))
            except KafkaProtocolError as e:
                results.append(rb("CreatableTopicResult", name=t.name, topic_id=None, error_code=e.code,
                                  error_message=e.message, num_partitions=-1, replication_factor=-1, configs=None))
        return rb.encode(throttle_time=0, topics=tuple(results))

    def _delete_topics(self, rb, r, authorized: bool) -> bytes:
        results = []
        for t in r.topics:
            code: int
            code, message = ErrorCode.NONE, None
            try:
                self._check(authorized)
                self._commit(self.leadership.decide_delete_topic(str(t.name)))
            except KafkaProtocolError as e:
                code, message = e.code, e.message
            results.append(rb("DeletableTopicResult", name=t.name, topic_id=t.topic_id, error_code=code,
                              error_message=message))
        return rb.encode(throttle_time=0, responses=tuple(results))

    def _create_partitions(self, rb, r, authorized: bool) -> bytes:
        results = []
        for t in r.topics:
            code: int = ErrorCode.NONE
            message: str | None = None
            try:
                self._check(authorized)
                assignments = None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]
                records = self.leadership.decide_create_partitions(str(t.name), int(t.count), assignments,
                                                                   self.live_brokers())
                if not r.validate_only:
                    self._commit(records)
            except KafkaProtocolError as e:
                code, message = e.code, e.message
            results.append(rb("CreatePartitionsTopicResult", name=t.name, error_code=code, error_message=message))
        return rb.encode(throttle_time=0, results=tuple(results))

    def _update_features(self, rb, r, authorized: bool) -> bytes:
        code: int
        code, message = ErrorCode.NONE, None
        try:
            self._check(authorized)
            self.security.update_features([(str(u.feature), int(u.max_version_level), int(u.upgrade_type))
                                           for u in r.feature_updates], bool(r.validate_only))
        except KafkaProtocolError as e:
            code, message = e.code, e.message
        return rb.encode(throttle_time=0, error_code=code, error_message=message, results=tuple(
            rb("UpdatableFeatureResult", feature=u.feature, error_code=code, error_message=message)
            for u in r.feature_updates))

    def _alter_configs(self, rb, r, authorized: bool) -> bytes:
        out = []
        for res in r.resources:
            code: int
            code, message = ErrorCode.NONE, None
            try:
                self._check(authorized)
                if int(res.resource_type) == BROKER_RESOURCE:
                    self.security.alter_broker_configs(
                        str(res.resource_name), [(c.name, int(c.config_operation), c.value) for c in res.configs],
                        bool(r.validate_only))
                    out.append(rb("AlterConfigsResourceResponse", error_code=0, error_message=None,
                                  resource_type=res.resource_type, resource_name=res.resource_name))
                    continue
                topic = self.leadership.topics.get(str(res.resource_name))
                if int(res.resource_type) != 2 or topic is None:
                    raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {res.resource_name!r}")
                overrides = dict(topic.overrides)
                for c in res.configs:
                    if int(c.config_operation) == 0:
                        overrides[c.name] = c.value
                    elif int(c.config_operation) == 1:
                        overrides.pop(c.name, None)
                    else:
                        raise KafkaProtocolError(ErrorCode.INVALID_CONFIG, "only SET and DELETE")
                parse_topic_configs(overrides)
                if not r.validate_only:
                    self._commit(self.leadership.decide_topic_config(topic.name, overrides))
            except KafkaProtocolError as e:
                code, message = e.code, e.message
            out.append(rb("AlterConfigsResourceResponse", error_code=code, error_message=message,
                          resource_type=res.resource_type, resource_name=res.resource_name))
        return rb.encode(throttle_time=0, responses=tuple(out))

    def _reassign(self, rb, r, authorized: bool) -> bytes:
        """A reassignment to [broker] moves the partition's leadership to that broker."""
        topics = []
        for t in r.topics:
            parts = []
            for p in t.partitions:
                code: int
                code, message = ErrorCode.NONE, None
                try:
                    self._check(authorized)
                    if not p.replicas or len(p.replicas) != 1:
                        raise KafkaProtocolError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                                 "give exactly one broker: the new leader")
                    self._commit(self.leadership.decide_move(str(t.name), int(p.partition_index),
                                                             int(p.replicas[0]), self.live_brokers()))
                except KafkaProtocolError as e:
                    code, message = e.code, e.message
                parts.append(rb("ReassignablePartitionResponse", partition_index=p.partition_index,
                                error_code=code, error_message=message))
            topics.append(rb("ReassignableTopicResponse", name=t.name, partitions=tuple(parts)))
        return rb.encode(throttle_time=0, error_code=0, error_message=None, responses=tuple(topics))


def _feed_name(api_key: int) -> str:
    return "the security records feed" if api_key == SECURITY_RECORDS_KEY else api_name(api_key)


def _framed(header: bytes, body: bytes) -> bytes:
    return b"".join((I32.pack(len(header) + len(body)), header, body))
