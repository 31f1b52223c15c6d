"""What the authorization-table tests share (test_api_rights.py, test_listing_rights.py): an
in-process broker over real sockets with SASL PLAIN users (`admin` a super user who grants and
takes alice's rights), requests built from each API's schema, and the authorization codes of an
answer."""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
import typing
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from types import UnionType

from kio.schema import types as kt

from oncelog.broker.config import BrokerConfig
from oncelog.core.security.api_rights import Right
from oncelog.core.security.principal import KafkaPrincipal
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.in_process import InProcessBroker
from oncelog.testing.raw_client import AsyncRawConnection
from oncelog.testing.secure import jaas

USERS = {"admin": "admin-pw", "alice": "alice-pw"}
TOPIC_NAME, GROUP_NAME, TXN_NAME, CLUSTER_NAME = "rights-topic", "rights-group", "rights-txn", "kafka-cluster"
AUTH_ERRORS = {E.TOPIC_AUTHORIZATION_FAILED, E.GROUP_AUTHORIZATION_FAILED, E.CLUSTER_AUTHORIZATION_FAILED,
               E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
TOPIC_ID: dict[str, uuid.UUID] = {}   # the test topic's id, once a fixture created it


# ------------------------------------------------------------------ requests from the schemas

def _value(hint, name: str, depth: int):
    origin = typing.get_origin(hint)
    if origin in (typing.Union, UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _value(args[0], name, depth) if args else None
    if origin is tuple:
        (item, *_rest) = typing.get_args(hint)
        return (_value(item, name, depth),)
    if hint is kt.TopicName:
        return kt.TopicName(TOPIC_NAME)
    if hint is kt.GroupId:
        return kt.GroupId(GROUP_NAME)
    if hint is kt.TransactionalId:
        return kt.TransactionalId(TXN_NAME)
    if dataclasses.is_dataclass(hint):
        return build(hint, depth + 1)
    if hint is str or (isinstance(hint, type) and issubclass(hint, str)):
        return "x"
    if hint is bool:
        return False
    if hint is bytes:
        return b""
    if hint is uuid.UUID:
        # the test topic's id where a request names topics by id (ShareFetch, ShareAcknowledge)
        return TOPIC_ID.get("id", uuid.UUID(int=0)) if name == "topic_id" else uuid.UUID(int=0)
    if hint is datetime.timedelta:
        return datetime.timedelta(seconds=30)
    if hint is datetime.datetime:
        return datetime.datetime.now(datetime.UTC)
    if isinstance(hint, type) and issubclass(hint, int):
        return hint(30000) if "timeout" in name else hint(0 if "epoch" not in name else -1)
    if isinstance(hint, type) and issubclass(hint, float):
        return hint(0)
    return None


# ACL enums: TOPIC, LITERAL (ANY in filters), READ, ALLOW
_ENUMS = {"resource_type_filter": 2, "resource_pattern_type": 3, "pattern_type": 3, "pattern_type_filter": 1,
          "operation": 3, "permission_type": 3}


def build(cls, depth: int = 0):
    """A request (or nested entity) of `cls`: the test's resources where the schema's types name
    one, each other field its type's zero (or a value the broker parses)."""
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("tag") is not None and f.default is not dataclasses.MISSING:
            continue
        kind = f.metadata.get("kafka_type", "")
        if f.name in _ENUMS:   # Kafka's enums have no 0: a request with one does not parse
            fields[f.name] = _ENUMS[f.name]
        elif f.name in ("principal", "principal_filter"):
            fields[f.name] = "User:x"
        elif f.name in ("host", "host_filter"):
            fields[f.name] = "*"
        elif f.name == "acks":
            fields[f.name] = -1          # acks=0 is answered by nothing
        elif f.name == "resource_type":
            fields[f.name] = hints[f.name](2) if isinstance(hints[f.name], type) else 2   # TOPIC (configs: TOPIC too)
        elif f.name == "resource_name":
            fields[f.name] = TOPIC_NAME
        elif kind.startswith("timedelta"):
            fields[f.name] = datetime.timedelta(seconds=30)
        elif kind.startswith("datetime"):
            fields[f.name] = datetime.datetime.now(datetime.UTC)
        elif kind == "float64":
            fields[f.name] = 0.0
        else:
            fields[f.name] = _value(hints[f.name], f.name, depth)
    return cls(**fields)


def schema_version(api: int, version: int) -> int:
    """The newest version at most `version` that kio has a schema for (the broker may serve one
    more, and Produce v13+ names topics by id), else the oldest one above it (kio has no Produce
    below v3)."""
    if api == ApiKey.PRODUCE:
        version = min(version, 12)
    for v in [*range(version, -1, -1), *range(version + 1, version + 20)]:
        try:
            entities.entity_class(api, v, "request")
            return v
        except ModuleNotFoundError:
            continue
    raise LookupError(f"kio has no schema of API {api} near v{version}")


def fields_of(request) -> dict:
    return {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}


def error_codes(response) -> set[int]:
    """Every error code of an answer, wherever its schema puts one."""
    out: set[int] = set()

    def walk(x) -> None:
        if dataclasses.is_dataclass(x):
            for f in dataclasses.fields(x):
                v = getattr(x, f.name)
                if f.metadata.get("kafka_type") == "error_code":
                    out.add(int(v))
                else:
                    walk(v)
        elif isinstance(x, tuple | list):
            for item in x:
                walk(item)
    walk(response)
    return out


def auth_codes(response) -> set[int]:
    return error_codes(response) & AUTH_ERRORS


# ------------------------------------------------------------------ the broker and the rights

class Secured:
    """The broker, `admin`'s connection, and alice's rights given and taken by admin."""

    def __init__(self, broker: InProcessBroker, host: str, port: int, users: dict[str, str]) -> None:
        self.broker, self.host, self.port, self.users = broker, host, port, users
        self.conns: list[AsyncRawConnection] = []
        self.admin: AsyncRawConnection

    async def login(self, user: str) -> AsyncRawConnection:
        c = await AsyncRawConnection.open(self.host, self.port)
        assert await c.plain_login(user, self.users[user]) == E.NONE
        self.conns.append(c)
        return c

    async def grant(self, granted: Iterable[tuple[Right, str]]) -> None:
        """Give alice each right on the resource named beside it (a literal ACL), then wait until
        the broker decides as granted."""
        granted = set(granted)
        if not granted:
            return
        acl = entities.nested(ApiKey.CREATE_ACLS, 3, "request", "AclCreation")
        r = await self.admin.call(ApiKey.CREATE_ACLS, 3, creations=tuple(acl(
            resource_type=int(g.resource), resource_name=name, resource_pattern_type=3,
            principal="User:alice", host="*", operation=int(g.operation), permission_type=3)
            for g, name in granted))
        assert all(int(x.error_code) == 0 for x in r.results)
        alice = KafkaPrincipal("User", "alice")
        await self._until(lambda: all(
            self.broker.authorizer.decide(alice, "127.0.0.1", g.operation, g.resource, name).allowed
            for g, name in granted))

    async def take_all(self, names: Iterable[tuple[object, str]]) -> None:
        """Delete every ACL of alice's; wait until the broker holds none for her on `names`
        ((resource type, name) pairs)."""
        f = entities.nested(ApiKey.DELETE_ACLS, 3, "request", "DeleteAclsFilter")
        r = await self.admin.call(ApiKey.DELETE_ACLS, 3, filters=(f(
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
            principal_filter="User:alice", host_filter=None, operation=1, permission_type=1),))
        assert int(r.filter_results[0].error_code) == 0
        names = list(names)
        await self._until(lambda: not any(
            self.broker.authorizer.acls.candidates(rt, name, ("User:alice",))[1] for rt, name in names))

    @staticmethod
    async def _until(check) -> None:
        # the broker follows the controller's ACLs
        deadline = time.monotonic() + 10
        while not check():
            assert time.monotonic() < deadline, "the broker did not follow the ACLs"
            await asyncio.sleep(0.01)


@asynccontextmanager
async def secured_broker(data_dir, users: dict[str, str] = USERS, clock=None, **extra: str) -> AsyncIterator[Secured]:
    """An in-process broker on SASL_PLAIN with the standard authorizer, `users` (admin its super
    user, logged in as `admin`); `clock`: the broker's, when a test moves time."""
    broker = InProcessBroker(BrokerConfig({
        "log.dirs": str(data_dir), "node.id": "1", "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas(users),
        "authorizer.class.name": "StandardAuthorizer", "super.users": "User:admin",
        "transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1", **extra}),
        **({"clock": clock} if clock is not None else {}))
    host, port = (await broker.start())[:2]
    s = Secured(broker, host, port, users)
    try:
        s.admin = await s.login("admin")
        yield s
    finally:
        for c in s.conns:
            await c.close()
        await broker.stop()


async def create_topic(s: Secured, name: str = TOPIC_NAME, partitions: int = 1) -> uuid.UUID:
    ct = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic")
    r = await s.admin.call(ApiKey.CREATE_TOPICS, 7, topics=(ct(name=name, num_partitions=partitions,
                                                               replication_factor=1, assignments=(), configs=()),),
                           timeout=10000, validate_only=False)
    assert int(r.topics[0].error_code) == E.NONE
    return r.topics[0].topic_id


async def commit_offset(s: Secured, group: str, topic: str = TOPIC_NAME) -> None:
    """An offset committed for `group` outside any generation (the group exists from then on)."""
    tp = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestTopic")
    pp = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestPartition")
    r = await s.admin.call(ApiKey.OFFSET_COMMIT, 8, group_id=group, generation_id_or_member_epoch=-1,
                           member_id="", group_instance_id=None, topics=(tp(name=topic, partitions=(pp(
                               partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                               committed_metadata=""),)),))
    assert int(r.topics[0].partitions[0].error_code) == E.NONE


async def init_producer_id(conn: AsyncRawConnection, transactional_id: str, timeout_ms: int = 60000,
                           version: int = 4, **fields):
    """InitProducerId, asked again while the coordinator is loading or has no producer ids yet
    (retriable codes; the first transactional request creates `__transaction_state`)."""
    deadline = time.monotonic() + 30
    while True:
        r = await conn.call(ApiKey.INIT_PRODUCER_ID, version, transactional_id=transactional_id,
                            transaction_timeout=timeout_ms, producer_id=-1, producer_epoch=-1, **fields)
        if int(r.error_code) not in (E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE,
                                     E.CONCURRENT_TRANSACTIONS) or time.monotonic() > deadline:
            return r
        await asyncio.sleep(0.05)
