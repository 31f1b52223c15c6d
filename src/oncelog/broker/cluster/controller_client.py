"""A broker's connection to the controller listener, SASL/SCRAM then Kafka requests in order;
also its connection to another broker (`broker.cluster.peers`), over TLS and with the inter-broker SASL
mechanism (PLAIN or SCRAM) as that listener needs.

Used for registration and heartbeats, producer-id blocks (KIP-730) and, in a cluster, the
metadata view and forwarded topic changes. One request at a time per connection keeps it simple;
the callers (heartbeat loop, id prefetch, metadata poll) each hold their own client.
"""
from __future__ import annotations

import asyncio
import itertools
import secrets
import ssl
import struct
import time
from typing import Any

from oncelog.core.security.plain import client_token
from oncelog.core.security.scram import ScramClient, ScramClientError, ScramMechanism
from oncelog.protocol import entities, headers
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.primitives import I32, Reader

# The controller link logs in with SCRAM, never PLAIN: SCRAM's last step is the server's proof that
# it holds the credential's verifier, checked before any request is sent, and the client's own
# proof is good for that exchange only. Whoever answers on the controller's port (a local user who
# bound it while the controller was down) learns no reusable secret, and gets no request.
CONTROLLER_MECHANISM = ScramMechanism.SCRAM_SHA_512.mechanism_name


class ControllerUnavailable(ConnectionError):
    """The controller could not be reached or closed the connection."""


class ControllerClient:
    def __init__(self, host: str, port: int, username: str | None, password: str | None,
                 client_id: str = "oncelog-broker", timeout_s: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None, mechanism: str = CONTROLLER_MECHANISM,
                 server_name: str = "controller", max_idle_ms: int = -1) -> None:
        self.host, self.port = host, port
        self.server_name = server_name   # for messages: "controller", "broker 2"
        self.ssl_context = ssl_context   # a controller listener on SSL/SASL_SSL
        self.username, self.password = username, password   # no username: no SASL step
        self.mechanism = mechanism
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        # reopened rather than reused after this long unused (negative: never), before the other
        # side's connections.max.idle.ms closes it under a request (`client_idle_ms`)
        self.max_idle_ms = max_idle_ms
        self._last_used = 0.0

    async def _connect(self) -> None:
        # asyncio.wait, not wait_for (see _exchange): a cancellation is never dropped
        tls = self.ssl_context
        opening = asyncio.ensure_future(asyncio.open_connection(
            self.host, self.port, ssl=tls, server_hostname=self.host if tls is not None else None))
        try:
            await asyncio.wait({opening}, timeout=self.timeout_s)
        except asyncio.CancelledError:
            opening.cancel()
            opening.add_done_callback(_close_opened)
            raise
        if not opening.done():
            opening.cancel()
            raise ControllerUnavailable(f"{self.server_name} {self.host}:{self.port}: no connection within "
                                        f"{self.timeout_s} s")
        try:
            self._reader, self._writer = opening.result()
        except OSError as e:   # ssl.SSLError among them: an untrusted controller is an unreachable one
            raise ControllerUnavailable(f"{self.server_name} {self.host}:{self.port}: {e}") from None
        if self.username is not None:
            await self._authenticate(self.username, self.password or "")

    async def _authenticate(self, user: str, password: str) -> None:
        hs = await self._call(ApiKey.SASL_HANDSHAKE, 1, mechanism=self.mechanism)
        if hs.error_code != 0:
            self.close()
            raise KafkaProtocolError(ErrorCode(int(hs.error_code)),
                                     f"{self.server_name} {self.host}:{self.port} refused SASL/{self.mechanism}")
        scram = ScramMechanism.from_name(self.mechanism)
        if scram is None:
            await self._token(client_token(user, password))
            return
        client = ScramClient(scram, user, password, secrets.token_bytes)
        try:
            server_final = await self._token(client.final_message(await self._token(client.first_message())))
            client.verify_server_final(server_final)
        except ScramClientError as e:   # not the server it claims to be (or a broken one)
            self.close()
            raise KafkaProtocolError(ErrorCode.SASL_AUTHENTICATION_FAILED,
                                     f"{self.server_name} {self.host}:{self.port}: {e}") from None

    async def _token(self, token: bytes) -> bytes:
        auth = await self._call(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=token)
        if auth.error_code != 0:
            self.close()
            raise KafkaProtocolError(ErrorCode(int(auth.error_code)), auth.error_message)
        return bytes(auth.auth_bytes)

    async def request(self, api_key: int, version: int, **fields: Any):
        """Send one request and return the decoded kio response entity."""
        request = entities.make(entities.entity_class(api_key, version, "request"), **fields)
        return entities.decode_response(api_key, version, await self.raw(api_key, version, entities.encode(request)))

    async def move_leader(self, topic: str, partition: int, broker: int,
                          timeout_ms: int = 30000) -> tuple[int, str | None]:
        """AlterPartitionReassignments with one replica: make `broker` the partition's leader.
        Returns (error code, message); 0 = moved (or already there)."""
        mod = entities.module(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, "request")
        part = entities.make(mod.ReassignablePartition, partition_index=partition, replicas=(broker,))
        r = await self.request(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, timeout=timeout_ms, topics=(
            entities.make(mod.ReassignableTopic, name=topic, partitions=(part,)),))
        p = r.responses[0].partitions[0] if r.responses else None
        return (int(p.error_code), p.error_message) if p is not None else (int(r.error_code), r.error_message)

    async def raw(self, api_key: int, version: int, body: bytes) -> bytes:
        """Send a pre-encoded request body; returns the response body (after its header)."""
        async with self._lock:
            try:
                if self._writer is not None and 0 <= self.max_idle_ms <= (time.monotonic() - self._last_used) * 1000:
                    self.close()
                if self._writer is not None and self._writer.transport.is_closing():
                    # closed under us (the controller went away between two requests): uvloop
                    # refuses the write with a RuntimeError, which no retry here would cure (a
                    # broker followed no view for minutes after a controller's kill -9)
                    self.close()
                if self._writer is None:
                    await self._connect()
                answer = await self._exchange(api_key, version, body)
                self._last_used = time.monotonic()
                return answer
            except ControllerUnavailable:
                self.close()
                raise
            except (TimeoutError, OSError, asyncio.IncompleteReadError) as e:
                self.close()
                raise ControllerUnavailable(f"{self.server_name} {self.host}:{self.port}: {e!r}") from None
            except asyncio.CancelledError:
                self.close()  # the answer may still come: the next request must not read it
                raise

    async def _call(self, api_key: int, version: int, **fields: Any):
        request = entities.make(entities.entity_class(api_key, version, "request"), **fields)
        body = await self._exchange(api_key, version, entities.encode(request))
        return entities.decode_response(api_key, version, body)

    async def _exchange(self, api_key: int, version: int, body: bytes) -> bytes:
        assert self._reader is not None and self._writer is not None
        corr = next(self._ids)
        header = headers.request_header(api_key, version, corr, self.client_id)
        self._writer.write(I32.pack(len(header) + len(body)) + header + body)
        # The deadline aborts the connection (the read then fails) rather than wrap the reads in
        # wait_for or asyncio.timeout: Python 3.11's wait_for returns an answer that arrived just
        # as its task was cancelled and drops the cancellation (a stopping broker's heartbeat loop
        # went on for ever), and asyncio.timeout needs a task, which a handler started by hand
        # (broker.net.connection._start) does not run in until it first waits.
        expired: list[bool] = []
        transport = self._writer.transport

        def expire() -> None:
            expired.append(True)
            transport.abort()
        deadline = asyncio.get_running_loop().call_later(self.timeout_s, expire)
        try:
            await self._writer.drain()
            size = struct.unpack(">i", await self._reader.readexactly(4))[0]
            data = await self._reader.readexactly(size)
        except (OSError, asyncio.IncompleteReadError):
            if expired:
                raise TimeoutError(f"no answer within {self.timeout_s} s") from None
            raise
        finally:
            deadline.cancel()
        if Reader(data).i32() != corr:
            raise ControllerUnavailable(f"correlation id mismatch from the {self.server_name}")
        return data[headers.response_header_size(api_key, version, data):]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


def controller_client(config, client_id: str = "oncelog-broker") -> ControllerClient:
    """A client of the controller named by a broker's settings: `controller.quorum.bootstrap.servers`,
    the cluster credential over SCRAM-SHA-512 (`inter_broker.cluster_credential`), and TLS when
    `controller.listener.names` names a listener that `listener.security.protocol.map` maps to SSL or
    SASL_SSL (trust from
    `listener.name.<controller>.ssl.truststore.location`, else `ssl.truststore.location`)."""
    host, _, port = config["controller.quorum.bootstrap.servers"].rpartition(":")
    context = None
    name = (config["controller.listener.names"] or "").split(",")[0].strip()
    if name:
        from oncelog.core.security.listeners import parse_protocol_map
        protocol = parse_protocol_map(config["listener.security.protocol.map"]).get(name.upper())
        if protocol is not None and protocol.uses_tls:
            context = ssl.create_default_context(
                cafile=config.listener_value(name, "ssl.truststore.location") or None,
                cadata=config.listener_value(name, "ssl.truststore.certificates") or None)
    from oncelog.broker.security.inter_broker import cluster_credential
    credential = cluster_credential(config)
    return ControllerClient(host, int(port), credential.username, credential.password, client_id=client_id,
                            ssl_context=context, max_idle_ms=client_idle_ms(config["connections.max.idle.ms"]))


def client_idle_ms(server_idle_ms: int) -> int:
    """How long a link to another oncelog process (which closes connections idle for
    `server_idle_ms`, the same setting as this broker's) may rest before it is reopened: 90% of
    it, as Kafka's clients (540000) stay under its brokers (600000)."""
    return -1 if server_idle_ms < 0 else server_idle_ms * 9 // 10


def _close_opened(opening: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    """A connection that opened after its caller was cancelled is closed, not leaked."""
    if not opening.cancelled() and opening.exception() is None:
        opening.result()[1].close()
