"""What a client knows about the cluster: bootstrap, brokers, topic metadata (leaders, leader
epochs, topic ids, our MessageFormatVersion tag), one connection per broker with reconnects."""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable

from oncelog.client.aio.connection import AuthenticationError, BrokerConnectionError, Connection
from oncelog.client.errors import KafkaClientError
from oncelog.client.security import ClientSecurity
from oncelog.protocol import metadata
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, error_code

log = logging.getLogger("oncelog.client.cluster")

RETRIABLE_METADATA = {ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                      ErrorCode.NOT_LEADER_OR_FOLLOWER}


class UnknownTopicError(KafkaClientError):
    """The topic does not exist (and was not auto-created) within the wait."""


def parse_bootstrap(servers) -> list[tuple[str, int]]:
    if isinstance(servers, str):
        servers = [s for s in servers.split(",") if s.strip()]
    out = []
    for s in servers:
        s = s.strip()
        if "://" in s:
            s = s.split("://", 1)[1]
        host, _, port = s.rpartition(":")
        out.append((host or "127.0.0.1", int(port)))
    if not out:
        raise KafkaClientError("bootstrap.servers is empty")
    return out


def parse_address_map(m) -> dict:
    if not m:
        return {}
    if isinstance(m, str):
        m = dict(item.split("=", 1) for item in m.split(",") if item.strip())
    out = {}
    for k, v in m.items():
        (kh, kp), = parse_bootstrap(k)
        (vh, vp), = parse_bootstrap(v)
        out[(kh, kp)] = (vh, vp)
    return out


class Cluster:
    def __init__(self, bootstrap, client_id: str = "oncelog", request_timeout_ms: int = 30000,
                 reconnect_backoff_ms: int = 50, allow_auto_create: bool = True,
                 address_map: dict | str | None = None, security: ClientSecurity | None = None) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.security = security or ClientSecurity()
        # "advertised host:port -> host:port to dial": reach brokers through a proxy
        self.address_map = parse_address_map(address_map)
        self.client_id = client_id
        self.timeout_s = request_timeout_ms / 1000
        self.reconnect_backoff_s = reconnect_backoff_ms / 1000
        self.allow_auto_create = allow_auto_create
        self.brokers: dict[int, metadata.BrokerEntry] = {}
        self.topics: dict[str, metadata.TopicEntry] = {}
        self.topic_ids: dict[str, object] = {}
        self.topic_names: dict[object, str] = {}
        self.controller_id = -1
        self.conns: dict[int, Connection] = {}
        self._connecting: dict[int, asyncio.Task] = {}
        self._failures: dict[int, int] = {}
        self._retry_at: dict[int, float] = {}
        self._bootstrap_conn: Connection | None = None
        self._refresh: asyncio.Task | None = None
        self._wanted: set[str] = set()
        self.last_refresh = 0.0
        self.listeners: list = []   # callables(metadata.MetadataResponse) after each refresh
        self.on_connect: list = []  # callables(node id) when a connection to a broker is made
        # KIP-584: the finalized features of the answer with the highest epoch from any broker
        # (Java's ApiVersions.update: a broker that has not caught up cannot take them back)
        self.finalized_features: dict[str, int] = {}
        self.features_epoch = -1
        self.closed = False

    # ------------------------------------------------------------------ connections

    async def any_connection(self) -> Connection:
        """A live connection to some broker (bootstrap if nothing is known yet)."""
        for c in self.conns.values():
            if not c.closed:
                return c
        if self._bootstrap_conn is not None and not self._bootstrap_conn.closed:
            return self._bootstrap_conn
        for node in list(self.brokers):
            try:
                return await self.connection(node)
            except BrokerConnectionError:
                continue
        errors = []
        for host, port in random.sample(self.bootstrap, len(self.bootstrap)):
            c = Connection(host, port, self.client_id, security=self.security)
            try:
                await c.connect(self.timeout_s)
            except AuthenticationError:
                raise   # refused credentials are fatal, as in Kafka's clients: no other broker will take them
            except (TimeoutError, BrokerConnectionError) as e:
                errors.append(str(e))
                continue
            self._bootstrap_conn = c
            self._learn_features(c)
            return c
        raise BrokerConnectionError("no broker reachable: " + "; ".join(errors))

    def _learn_features(self, c: Connection) -> None:
        if c.features_epoch > self.features_epoch:
            self.finalized_features, self.features_epoch = c.finalized_features, c.features_epoch

    def ready_connection(self, node: int) -> Connection | None:
        c = self.conns.get(node)
        return c if c is not None and not c.closed else None

    async def connection(self, node: int) -> Connection:
        c = self.ready_connection(node)
        if c is not None:
            return c
        t = self._connecting.get(node)
        if t is None or t.done():
            t = self._connecting[node] = asyncio.ensure_future(self._connect(node))
        return await asyncio.shield(t)

    def start_connect(self, node: int) -> asyncio.Task | None:
        """Connect to `node` in the background (unless connected, connecting or backing off);
        returns the latest connection attempt, if any."""
        if time.monotonic() < self._retry_at.get(node, 0):
            return self._connecting.get(node)
        if self.ready_connection(node) is None:
            t = self._connecting.get(node)
            if t is None or t.done():
                t = self._connecting[node] = asyncio.ensure_future(self._connect(node))
                t.add_done_callback(lambda f: f.cancelled() or f.exception())
        return self._connecting.get(node)

    async def _connect(self, node: int) -> Connection:
        b = self.brokers.get(node)
        if b is None:
            raise BrokerConnectionError(f"unknown broker {node}")
        old = self.conns.get(node)
        if old is not None and old.closed:
            await asyncio.sleep(self.reconnect_backoff_s)
        host, port = self.address_map.get((b.host, b.port), (b.host, b.port))
        c = Connection(host, port, self.client_id, node, security=self.security)
        try:
            await c.connect(self.timeout_s)
        except BaseException:
            # back off exponentially (to 1 s) so that a dead broker does not spin the sender
            n = self._failures[node] = self._failures.get(node, 0) + 1
            self._retry_at[node] = time.monotonic() + min(1.0, self.reconnect_backoff_s * 2 ** (n - 1))
            raise
        self._failures.pop(node, None)
        self._retry_at.pop(node, None)
        self.conns[node] = c
        self._learn_features(c)
        for fn in self.on_connect:
            fn(node)
        return c

    async def dedicated_connection(self, node: int) -> Connection:
        """A connection of its own to `node`, outside the pool (a group member's link to its
        coordinator: a JoinGroup waiting for the rebalance must not hold up the fetches); the
        caller closes it."""
        b = self.brokers.get(node)
        if b is None:
            raise BrokerConnectionError(f"unknown broker {node}")
        host, port = self.address_map.get((b.host, b.port), (b.host, b.port))
        c = Connection(host, port, self.client_id, node, security=self.security)
        await c.connect(self.timeout_s)
        return c

    def version(self, api_key: int) -> int | None:
        """The highest version every connected broker accepts for this API."""
        vs = [c.version(api_key) for c in self.conns.values() if not c.closed]
        if not vs and self._bootstrap_conn is not None:
            vs = [self._bootstrap_conn.version(api_key)]
        if not vs or any(v is None for v in vs):
            return None
        return min(vs)  # type: ignore[type-var]  # no None (checked above)

    # ------------------------------------------------------------------ metadata

    async def request_any(self, api_key: int, body_for_version, max_version: int | None = None):
        c = await self.any_connection()
        v = c.version(api_key)
        if v is None:
            raise KafkaClientError(f"broker {c.addr} does not support API {api_key}")
        if max_version is not None:
            v = min(v, max_version)
        return v, await asyncio.wait_for(c.request(api_key, v, body_for_version(v)), self.timeout_s)

    async def refresh(self, topics: list[str] | None = None) -> metadata.MetadataResponse:
        """Fetch metadata for `topics` (None = all) plus every topic already of interest."""
        want = None if topics is None else sorted(set(topics) | self._wanted)
        for attempt in range(3):
            try:
                v, body = await self.request_any(
                    ApiKey.METADATA, lambda v: metadata.encode_request(v, want, self.allow_auto_create))
                break
            except (TimeoutError, BrokerConnectionError):
                if attempt == 2:
                    raise
                await asyncio.sleep(self.reconnect_backoff_s * (attempt + 1))
        info = metadata.decode_response(v, body)
        self._apply(info)
        return info

    def _apply(self, info: metadata.MetadataResponse) -> None:
        if info.brokers:
            for node, b in info.brokers.items():
                old = self.brokers.get(node)
                if old is not None and (old.host, old.port) != (b.host, b.port):
                    c = self.conns.pop(node, None)
                    if c is not None:
                        c.close()
            self.brokers = info.brokers
        self.controller_id = info.controller_id
        for name, t in info.topics.items():
            if t.error_code == 0:
                self.topics[name] = t
                if t.topic_id is not None and t.topic_id.int:
                    self.topic_ids[name] = t.topic_id
                    self.topic_names[t.topic_id] = name
            elif t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self.topics.pop(name, None)
        self.last_refresh = time.monotonic()
        for fn in self.listeners:
            fn(info)

    def want(self, topics: Iterable[str]) -> None:
        """Keep `topics` in every refresh from now on, the background ones (`request_refresh`)
        too: without them a refresh asked for no topic and never learned their new leaders."""
        self._wanted.update(topics)

    def request_refresh(self) -> None:
        """Refresh in the background once (coalesced)."""
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._refresh_quietly())

    async def refreshed(self, timeout_s: float) -> None:
        """A background refresh (`request_refresh`), waited for at most `timeout_s` (it goes on
        after that; a failed one is retried at the next need)."""
        self.request_refresh()
        assert self._refresh is not None
        await asyncio.wait({self._refresh}, timeout=timeout_s)

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh(sorted(self._wanted) if self._wanted else [])
        except Exception as e:  # noqa: BLE001 - background refresh: retried on the next need
            log.debug("metadata refresh failed: %r", e)
            await asyncio.sleep(self.reconnect_backoff_s)

    async def topic(self, name: str, timeout_s: float) -> metadata.TopicEntry:
        """Metadata for one topic, waiting for leaders (a freshly created topic has none yet)."""
        self._wanted.add(name)
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            t = self.topics.get(name)
            if t is not None and t.partitions and all(p.leader_id >= 0 for p in t.partitions):
                return t
            try:
                info = await self.refresh([name])
                t = info.topics.get(name)
                if t is not None and t.error_code not in (0, *RETRIABLE_METADATA):
                    raise KafkaClientError(
                        f"metadata for topic {name}: {error_code(t.error_code).name}")
            except (TimeoutError, BrokerConnectionError) as e:
                log.debug("metadata for %s: %r", name, e)
            t = self.topics.get(name)
            if t is not None and t.partitions and all(p.leader_id >= 0 for p in t.partitions):
                return t
            if time.monotonic() >= deadline:
                raise UnknownTopicError(f"topic {name} not available within {timeout_s:.1f}s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def close(self) -> None:
        self.closed = True
        for c in self.conns.values():
            c.close()
        if self._bootstrap_conn is not None:
            self._bootstrap_conn.close()
        for t in self._connecting.values():
            t.cancel()
        if self._refresh is not None:
            self._refresh.cancel()
