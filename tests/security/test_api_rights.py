"""The authorization table (`core.security.api_rights`, issue 36): every API key and version the
broker serves has one declaration of the rights it needs, and a test generated from the table
sends every API, as a principal with no right, then with every right it declares, then with all
but one: refused (an authorization error in its answer), answered without any authorization
error, refused again. Kafka's AuthorizerIntegrationTest.requestKeysToAcls, over real sockets to
an in-process broker (SASL PLAIN users, `admin` a super user who grants and takes the rights).

Requests are built from each API's schema: a group id is the test's group, a topic name its
topic, a transactional id its id (kio's GroupId / TopicName / TransactionalId types), everything
else the type's zero. Such a request may be wrong in other ways; only the authorization codes of
its answer are looked at."""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
import typing
import uuid
from types import UnionType

import pytest
from kio.schema import types as kt

from oncelog.broker.config import BrokerConfig
from oncelog.core.security.acl import AclOperation, ResourceType
from oncelog.core.security.api_rights import API_RIGHTS, ApiRights, Right, rights_for
from oncelog.core.security.principal import KafkaPrincipal
from oncelog.protocol import entities
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey, api_name
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.in_process import InProcessBroker
from oncelog.testing.raw_client import AsyncRawConnection
from oncelog.testing.secure import jaas

USERS = {"admin": "admin-pw", "alice": "alice-pw"}
TOPIC_NAME, GROUP_NAME, TXN_NAME = "rights-topic", "rights-group", "rights-txn"
AUTH_ERRORS = {E.TOPIC_AUTHORIZATION_FAILED, E.GROUP_AUTHORIZATION_FAILED, E.CLUSTER_AUTHORIZATION_FAILED,
               E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
NAMES = {ResourceType.TOPIC: TOPIC_NAME, ResourceType.GROUP: GROUP_NAME, ResourceType.TRANSACTIONAL_ID: TXN_NAME,
         ResourceType.CLUSTER: "kafka-cluster"}
# not generated: the SASL exchange itself, and the requests whose answer the generic request
# cannot reach (named here, with why, so the list is read when it grows)
TOPIC_ID: dict[str, uuid.UUID] = {}   # the test topic's id, once the fixture created it
NOT_GENERATED = {
    ApiKey.SASL_HANDSHAKE: "the login itself",
    ApiKey.SASL_AUTHENTICATE: "the login itself",
}


# ------------------------------------------------------------------ the table is complete

def test_every_served_api_and_version_has_one_declaration():
    missing = [(api_name(k), v) for k, (lo, hi) in sorted(BROKER_VERSIONS.items()) for v in range(lo, hi + 1)
               if rights_for(k, v) is None]
    assert missing == [], f"served without an entry in core/security/api_rights.py: {missing}"
    for k, entries in API_RIGHTS.items():
        assert k in BROKER_VERSIONS, f"{api_name(k)} has rights but is not served"
        lo, hi = BROKER_VERSIONS[k]
        seen: set[int] = set()
        for e in entries:
            versions = set(range(e.versions[0], e.versions[1] + 1))
            assert versions <= set(range(lo, hi + 1)), f"{api_name(k)} {e.versions} beyond {lo}-{hi}"
            assert not versions & seen, f"{api_name(k)}: versions declared twice"
            seen |= versions
            assert e.open or e.filtered or e.broker_only or e.all_of or e.any_of, f"{api_name(k)}: empty entry"


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


def request_for(api: int, version: int):
    if api == ApiKey.PRODUCE:
        version = min(version, 12)   # v13+ names topics by id
    while True:   # the newest version kio has a schema for (the broker may serve one more)
        try:
            cls = entities.entity_class(api, version, "request")
            break
        except ModuleNotFoundError:
            version -= 1
    r = build(cls)
    return version, _override(api, r)


def _override(api: int, r):
    overrides = {   # where the type's zero is not the resource the table names
        ApiKey.FIND_COORDINATOR: {"key": GROUP_NAME, "key_type": 0, "coordinator_keys": (GROUP_NAME,)},
        ApiKey.DESCRIBE_CONFIGS: {},
        ApiKey.INIT_PRODUCER_ID: {"transactional_id": None, "producer_id": -1},
    }.get(api, {})
    names = {f.name for f in dataclasses.fields(r)}
    return dataclasses.replace(r, **{k: v for k, v in overrides.items() if k in names})


def auth_codes(response) -> set[int]:
    out: set[int] = set()

    def walk(x) -> None:
        if dataclasses.is_dataclass(x):
            for f in dataclasses.fields(x):
                v = getattr(x, f.name)
                if f.metadata.get("kafka_type") == "error_code":
                    if int(v) in AUTH_ERRORS:
                        out.add(int(v))
                else:
                    walk(v)
        elif isinstance(x, tuple):
            for item in x:
                walk(item)
    walk(response)
    return out


# ------------------------------------------------------------------ the generated test

CASES = [(k, e.versions[1], e) for k, entries in sorted(API_RIGHTS.items()) for e in entries
         if k not in NOT_GENERATED and not e.open and not e.filtered]


@pytest.fixture
async def rights(tmp_path):
    broker = InProcessBroker(BrokerConfig({
        "log.dirs": str(tmp_path / "data"), "node.id": "1", "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas(USERS),
        "authorizer.class.name": "StandardAuthorizer", "super.users": "User:admin",
        "transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1"}))
    host, port = (await broker.start())[:2]
    conns = []

    async def login(user: str) -> AsyncRawConnection:
        c = await AsyncRawConnection.open(host, port)
        assert await c.plain_login(user, USERS[user]) == E.NONE
        conns.append(c)
        return c

    admin = await login("admin")
    ct = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic")
    r = await admin.call(ApiKey.CREATE_TOPICS, 7, topics=(ct(name=TOPIC_NAME, num_partitions=1, replication_factor=1,
                                                             assignments=(), configs=()),),
                         timeout=10000, validate_only=False)
    assert int(r.topics[0].error_code) == E.NONE
    TOPIC_ID["id"] = r.topics[0].topic_id
    # the group exists (an offset committed), so group APIs reach their topic checks
    tp = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestTopic")
    pp = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestPartition")
    r = await admin.call(ApiKey.OFFSET_COMMIT, 8, group_id=GROUP_NAME, generation_id_or_member_epoch=-1,
                         member_id="", group_instance_id=None, topics=(tp(name=TOPIC_NAME, partitions=(pp(
                             partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                             committed_metadata=""),)),))
    assert int(r.topics[0].partitions[0].error_code) == E.NONE

    async def grant(granted: set[Right], take: bool = False) -> None:
        acl = entities.nested(ApiKey.CREATE_ACLS, 3, "request", "AclCreation")
        if not take:
            if granted:
                r = await admin.call(ApiKey.CREATE_ACLS, 3, creations=tuple(acl(
                    resource_type=int(g.resource), resource_name=NAMES[g.resource], resource_pattern_type=3,
                    principal="User:alice", host="*", operation=int(g.operation), permission_type=3)
                    for g in granted))
                assert all(int(x.error_code) == 0 for x in r.results)
        else:
            f = entities.nested(ApiKey.DELETE_ACLS, 3, "request", "DeleteAclsFilter")
            r = await admin.call(ApiKey.DELETE_ACLS, 3, filters=(f(
                resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                principal_filter="User:alice", host_filter=None, operation=1, permission_type=1),))
            assert int(r.filter_results[0].error_code) == 0
        # the broker follows the controller's ACLs: wait until it decides as granted
        alice = KafkaPrincipal("User", "alice")
        deadline = time.monotonic() + 10
        while True:
            if take:
                if not any(broker.authorizer.acls.candidates(rt, NAMES[rt], ("User:alice",))[1] for rt in NAMES):
                    return
            elif all(broker.authorizer.decide(alice, "127.0.0.1", g.operation, g.resource, NAMES[g.resource]).allowed
                     for g in granted):
                return
            assert time.monotonic() < deadline, "the broker did not follow the ACLs"
            await asyncio.sleep(0.01)

    alice = await login("alice")
    yield alice, grant
    for c in conns:
        await c.close()
    await broker.stop()


def _needed(e: ApiRights) -> set[Right]:
    return set(e.all_of) | {alternatives[0] for alternatives in e.any_of}


@pytest.mark.parametrize("api,version,entry", CASES, ids=[f"{api_name(k)}-v{v}" for k, v, _e in CASES])
async def test_an_api_needs_every_right_it_declares_and_no_other(rights, api, version, entry):
    alice, grant = rights
    version, request = request_for(api, version)

    async def codes() -> set[int]:
        return auth_codes(await alice.call(api, version, **{f.name: getattr(request, f.name)
                                                             for f in dataclasses.fields(request)}))
    assert await codes(), f"{api_name(api)} v{version} answered a principal without rights with no refusal"
    if entry.broker_only:
        await grant({Right(AclOperation.ALL, ResourceType.CLUSTER)})
        assert await codes(), "no ACL stands in for the broker principal"
        await grant(set(), take=True)
        return
    needed = _needed(entry)
    await grant(needed)
    assert not await codes(), f"{api_name(api)} v{version} refused with every right it declares: {needed}"
    await grant(set(), take=True)
    for missing in needed:
        alternatives = next((alts for alts in entry.any_of if missing in alts), ())
        await grant(needed - {missing})
        if not alternatives:
            assert await codes(), f"{api_name(api)} v{version} answered without {missing}"
        await grant(set(), take=True)
