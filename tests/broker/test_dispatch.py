"""The broker's one error boundary (`Dispatcher.handle`): bytes that do not make a request close
that connection; a handler that raises is a bug in oncelog, logged as one and answered
UNKNOWN_SERVER_ERROR in the response the request expects, on a connection that stays open. Every
API answers an error in its own response format (Kafka's getErrorResponse)."""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import types
import typing
import uuid

import pytest
from kio.schema.describe_cluster.v0.request import DescribeClusterRequest
from kio.schema.describe_cluster.v0.response import DescribeClusterResponse
from kio.schema.list_groups.v4.request import ListGroupsRequest
from kio.schema.list_groups.v4.response import ListGroupsResponse
from kio.serial import entity_reader
from test_dedup_raw import Client, Conn, batch, parse_produce, produce_body

from oncelog.broker.config import BrokerConfig
from oncelog.broker.handlers import APIS
from oncelog.broker.net.dispatch import HANDLER_BUG
from oncelog.protocol import entities
from oncelog.protocol import produce as produce_wire
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.in_process import InProcessBroker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def node(tmp_path):
    b = InProcessBroker(BrokerConfig({"log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0"}))
    host, port = await b.start()
    conn = await Conn.open(host, port)
    yield b, Client(conn)
    await conn.close()
    await b.stop()


def _bug(monkeypatch, api_key: int, wait_first: bool = False) -> None:
    async def buggy(broker, version, request):
        if wait_first:
            await asyncio.sleep(0.01)  # the answer is then finished by a task, not at once
        raise TypeError("a bug in a handler, not in the request")
    monkeypatch.setitem(APIS, api_key, APIS[api_key]._replace(handle=buggy))


def _count(broker, metric: str) -> float:
    return broker.metrics.registry.get_sample_value(metric)


def _bugs_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if HANDLER_BUG in r.getMessage()]


@pytest.mark.handler_bug
@pytest.mark.parametrize("wait_first", [False, True])
async def test_a_handler_bug_is_answered_unknown_server_error_and_logged_as_a_bug(node, monkeypatch, caplog,
                                                                                   wait_first):
    broker, c = node
    caplog.set_level(logging.ERROR, "oncelog.broker")
    _bug(monkeypatch, ApiKey.LIST_GROUPS, wait_first)
    r = await c.conn.kio(ListGroupsRequest(states_filter=()), ListGroupsResponse)
    assert r.error_code.value == E.UNKNOWN_SERVER_ERROR and r.groups == ()
    # the same connection is still served: the client did nothing wrong
    d = await c.conn.kio(DescribeClusterRequest(include_cluster_authorized_operations=False),
                         DescribeClusterResponse)
    assert d.error_code.value == 0
    assert [m.split(" (")[0] for m in _bugs_logged(caplog)] == [f"{HANDLER_BUG} list_groups v4"]
    assert _count(broker, "oncelog_handler_bugs_total") == 1
    assert _count(broker, "oncelog_connections_closed_on_bad_input_total") == 0


@pytest.mark.handler_bug
async def test_a_produce_handler_bug_answers_every_partition(node, monkeypatch, caplog):
    broker, c = node
    await c.create_topic("t")
    _bug(monkeypatch, ApiKey.PRODUCE)
    p, _tags = await c.produce("t", batch(0))
    assert (p["index"], p["error_code"], p["base_offset"]) == (0, E.UNKNOWN_SERVER_ERROR, -1)
    assert len(_bugs_logged(caplog)) == 1
    monkeypatch.undo()
    p, _tags = await c.produce("t", batch(0))  # and the next one is appended as usual
    assert (p["error_code"], p["base_offset"]) == (0, 0)


async def test_a_malformed_request_still_closes_its_connection(node, caplog):
    broker, c = node
    body = produce_body(9, "t", 0, bytes(batch(0)))[:7]  # cut inside the topic array
    with pytest.raises(asyncio.IncompleteReadError):
        await c.conn.raw(0, 9, body, True)
    assert _count(broker, "oncelog_connections_closed_on_bad_input_total") == 1
    assert _count(broker, "oncelog_handler_bugs_total") == 0 and not _bugs_logged(caplog)


# -------------------------------------------------------------- error answers, every API and version

def _sample(cls):
    """A request entity with one element in every array and plain values elsewhere."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if typing.get_origin(hint) is not tuple and (f.default is not dataclasses.MISSING
                                                     or f.default_factory is not dataclasses.MISSING):
            continue
        if typing.get_origin(hint) is tuple:
            element = typing.get_args(hint)[0]
            values[f.name] = (_sample(element) if dataclasses.is_dataclass(element)
                              else _scalar(f.metadata.get("kafka_type", "")),)
        elif dataclasses.is_dataclass(hint):
            values[f.name] = _sample(hint)
        else:
            values[f.name] = _scalar(f.metadata.get("kafka_type", ""))
    return cls(**values)


def _scalar(kafka_type: str):
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "datetime_i64":
        return None
    if kafka_type == "string":
        return "x"
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=1)
    if kafka_type in ("bytes", "records"):
        return None if kafka_type == "records" else b""
    if kafka_type == "int8":
        return 1  # ANY in the ACL enums, whose 0 (UNKNOWN) fails a request's parse as in Kafka
    return 0


def _error_codes(entity) -> list[int]:
    out = []
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if f.metadata.get("kafka_type") == "error_code":
            out.append(int(value.value))
        for item in value if isinstance(value, tuple) else (value,):
            if dataclasses.is_dataclass(item):
                out.extend(_error_codes(item))
    return out


@pytest.mark.parametrize("api_key", sorted(APIS))
def test_every_api_answers_an_error_in_its_own_format(api_key):
    api = APIS[api_key]
    low, high = BROKER_VERSIONS[api_key]
    for version in range(low, high + 1):
        wire_version = min(version, 13) if api_key == ApiKey.PRODUCE else version  # v14 = v13 + tags
        if api_key == ApiKey.PRODUCE and version < 3:  # kio has no Produce v0-v2 (Kafka 4 dropped them)
            body = produce_wire.encode_request(version, 0, 1000, {"x": [(0, b"")]})
        else:
            body = entities.encode(_sample(entities.entity_class(api_key, wire_version, "request")))
        request = api.decode(version, memoryview(body))
        if api_key == ApiKey.PRODUCE:
            assert api.error_response(version, request, E.UNKNOWN_SERVER_ERROR) is None  # acks=0: no answer
            request.acks = -1
        answer = api.error_response(version, request, E.UNKNOWN_SERVER_ERROR)
        if api_key == ApiKey.PRODUCE:
            codes = [parse_produce(version, answer)[0]["error_code"]]
        else:
            response = entity_reader(entities.entity_class(api_key, version, "response"))(answer, 0)[0]
            codes = _error_codes(response)
        if api_key == ApiKey.DESCRIBE_LOG_DIRS and version < 3 and not codes:
            continue   # v1-2 have no top-level error code: Kafka answers an error with no results
        assert codes and set(codes) == {E.UNKNOWN_SERVER_ERROR}, (api_key, version, codes)
