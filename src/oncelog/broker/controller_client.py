"""A broker's connection to the controller listener: SASL/PLAIN, then Kafka requests in order.

Used for registration and heartbeats, producer-id blocks (KIP-730) and, in a cluster, the
metadata view and forwarded topic changes. One request at a time per connection keeps it simple;
the callers (heartbeat loop, id prefetch, metadata poll) each hold their own client.
"""
from __future__ import annotations

import asyncio
import itertools
import struct
from typing import Any

from oncelog.protocol import entities, headers
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.primitives import I32, Reader


class ControllerUnavailable(ConnectionError):
    """The controller could not be reached or closed the connection."""


class ControllerClient:
    def __init__(self, host: str, port: int, username: str, password: str, client_id: str = "oncelog-broker",
                 timeout_s: float = 10.0) -> None:
        self.host, self.port = host, port
        self.username, self.password = username, password
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    async def _connect(self) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, asyncio.TimeoutError) as e:
            raise ControllerUnavailable(f"controller {self.host}:{self.port}: {e}") from None
        hs = await self._call(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN")
        if hs.error_code != 0:
            raise KafkaProtocolError(ErrorCode(int(hs.error_code)), "controller refused SASL/PLAIN")
        token = b"\x00" + self.username.encode() + b"\x00" + self.password.encode()
        auth = await self._call(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=token)
        if auth.error_code != 0:
            self.close()
            raise KafkaProtocolError(ErrorCode(int(auth.error_code)), auth.error_message)

    async def request(self, api_key: int, version: int, **fields: Any):
        """Send one request and return the decoded kio response entity."""
        if asyncio.current_task() is None:
            return await asyncio.ensure_future(self.request(api_key, version, **fields))  # see _in_task
        async with self._lock:
            if self._writer is None:
                await self._connect()
            try:
                return await self._call(api_key, version, **fields)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
                self.close()
                raise ControllerUnavailable(f"controller {self.host}:{self.port}: {e!r}") from None
            except asyncio.CancelledError:
                self.close()  # the answer may still come: the next request must not read it
                raise

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
        if asyncio.current_task() is None:
            return await asyncio.ensure_future(self.raw(api_key, version, body))  # see _in_task
        async with self._lock:
            if self._writer is None:
                await self._connect()
            try:
                return await self._exchange(api_key, version, body)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
                self.close()
                raise ControllerUnavailable(f"controller {self.host}:{self.port}: {e!r}") from None
            except asyncio.CancelledError:
                self.close()
                raise

    # _in_task: the broker's dispatch runs a handler by hand until it first waits (server._start),
    # outside any task, and asyncio.timeout (in _exchange) refuses to run there; a handler that
    # forwards to the controller (CreateTopics, CreatePartitions in a cluster) gets a task.

    async def _call(self, api_key: int, version: int, **fields: Any):
        request = entities.make(entities.entity_class(api_key, version, "request"), **fields)
        body = await self._exchange(api_key, version, entities.encode(request))
        return entities.decode_response(api_key, version, body)

    async def _exchange(self, api_key: int, version: int, body: bytes) -> bytes:
        assert self._reader is not None and self._writer is not None
        corr = next(self._ids)
        header = headers.request_header(api_key, version, corr, self.client_id)
        self._writer.write(I32.pack(len(header) + len(body)) + header + body)
        await self._writer.drain()
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns a result that arrived just as
        # the task was cancelled and drops the cancellation, so a stopping broker's heartbeat loop
        # went on forever
        async with asyncio.timeout(self.timeout_s):
            size = struct.unpack(">i", await self._reader.readexactly(4))[0]
            data = await self._reader.readexactly(size)
        if Reader(data).i32() != corr:
            raise ControllerUnavailable("correlation id mismatch from the controller")
        return data[headers.response_header_size(api_key, version, data):]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
