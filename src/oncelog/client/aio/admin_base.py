"""What the admin client's requests share: the error a refusal raises, and how a request reaches
a broker (any one, the controller where the metadata names one, or a given connection)."""
from __future__ import annotations

import asyncio

from oncelog.client.aio import wire
from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.connection import Connection
from oncelog.client.errors import KafkaClientError
from oncelog.protocol.api import api_name
from oncelog.protocol.entities import RequestBuilder
from oncelog.protocol.errors import error_code


class AdminError(KafkaClientError):
    """A broker refused an admin request; `code` is the Kafka error."""

    def __init__(self, code: int, what: str, message: str | None = None) -> None:
        self.code = error_code(code)
        name = self.code.name
        super().__init__(f"{what}: {name}" + (f": {message}" if message else ""))


async def request(cluster: Cluster, api_key: int, build, parse, *, controller: bool = False,
                  conn: Connection | None = None):
    """`build(version)` -> body, `parse(version, body)` -> result; sent on `conn`, else to the
    controller (falling back to any broker, which forwards or refuses), else to any broker."""
    if controller and cluster.controller_id >= 0 and cluster.controller_id in cluster.brokers:
        try:
            conn = await cluster.connection(cluster.controller_id)
        except Exception:  # noqa: BLE001 - fall back to any broker; it forwards or refuses
            conn = None
    if conn is None:
        conn = await cluster.any_connection()
    v = conn.version(api_key)
    if v is None:
        raise KafkaClientError(f"broker {conn.addr} does not support API key {api_key}")
    body = await asyncio.wait_for(conn.request(api_key, v, build(v)), cluster.timeout_s)
    return parse(v, body)


async def ask(conn: Connection, api_key: int, build, timeout_s: float):
    """One request on `conn`: `build(RequestBuilder)` -> body; returns (version, decoded answer)."""
    v = conn.version(api_key)
    if v is None:
        raise KafkaClientError(f"broker {conn.addr} does not support {api_name(api_key)}")
    body = await asyncio.wait_for(conn.request(api_key, v, build(RequestBuilder(api_key, v))), timeout_s)
    return v, wire.decode(api_key, v, body)


async def ask_controller(cluster: Cluster, api_key: int, build):
    """`ask` the controller (any broker where the metadata names none): the decoded answer."""
    return await request(cluster, api_key, lambda v: build(RequestBuilder(api_key, v)),
                         lambda v, body: wire.decode(api_key, v, body), controller=True)
