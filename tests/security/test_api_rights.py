"""The authorization table (`core.security.api_rights`, issue 36): every API key and version the
broker serves has one declaration of the rights it needs, and a test generated from the table
sends every API, as a principal with no right, then with every right it declares, then with all
but one: refused (an authorization error in its answer), answered without any authorization
error, refused again. Kafka's AuthorizerIntegrationTest.requestKeysToAcls, over real sockets to
an in-process broker (SASL PLAIN users, `admin` a super user who grants and takes the rights).
The SASL exchange is generated from the table too: the entries declared `pre_auth` are answered
before authentication, at their place in the login (`PRE_AUTH_ORDER`), every other API is
refused there (the connection closed, unanswered or answered ILLEGAL_SASL_STATE), and after the
login SaslHandshake and SaslAuthenticate are refused ILLEGAL_SASL_STATE to a principal with no
right, granting nothing.

Requests are built from each API's schema: a group id is the test's group, a topic name its
topic, a transactional id its id (kio's GroupId / TopicName / TransactionalId types), everything
else the type's zero. Such a request may be wrong in other ways; only the authorization codes of
its answer are looked at."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest
from tests.security.rights_support import (
    CLUSTER_NAME,
    GROUP_NAME,
    TOPIC_ID,
    TOPIC_NAME,
    TXN_NAME,
    USERS,
    auth_codes,
    build,
    commit_offset,
    create_topic,
    error_codes,
    fields_of,
    schema_version,
    secured_broker,
)

from oncelog.core.security.acl import AclOperation, ResourceType
from oncelog.core.security.api_rights import API_RIGHTS, PRE_AUTH_ORDER, ApiRights, Right, listing_for, rights_for
from oncelog.core.security.plain import client_token
from oncelog.protocol import entities
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey, api_name
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.raw_client import AsyncRawConnection

NAMES = {ResourceType.TOPIC: TOPIC_NAME, ResourceType.GROUP: GROUP_NAME, ResourceType.TRANSACTIONAL_ID: TXN_NAME,
         ResourceType.CLUSTER: CLUSTER_NAME}
# APIs whose group must be an empty share group (the test's group is a classic one, and Kafka
# answers GROUP_ID_NOT_FOUND for it at the top level, without its topics' authorization errors):
# theirs, with a state on the test's topic set by admin before the requests
SHARE_GROUP_NAME = "rights-share-group"
SHARE_GROUP_APIS = {ApiKey.ALTER_SHARE_GROUP_OFFSETS, ApiKey.DELETE_SHARE_GROUP_OFFSETS}
# not generated: requests whose answer the generic request cannot reach (named here, with why, so
# the list is read when it grows); the SASL exchange has tests of its own below, from `pre_auth`
NOT_GENERATED: dict[int, str] = {}


# ------------------------------------------------------------------ the table is complete

def test_the_apis_served_before_authentication_are_the_logins():
    pre_auth = {k for k, entries in API_RIGHTS.items() for e in entries if e.pre_auth}
    assert pre_auth == set(PRE_AUTH_ORDER), "PRE_AUTH_ORDER names every pre_auth entry, in the login's order"
    for k in PRE_AUTH_ORDER:   # every version the broker serves
        lo, hi = BROKER_VERSIONS[k]
        assert all(rights_for(k, v) is not None and rights_for(k, v).pre_auth for v in range(lo, hi + 1)), api_name(k)


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
            # served to a connection nobody knows yet: it can need no right
            assert not e.pre_auth or e.open, f"{api_name(k)}: served before authentication, yet needs a right"
            # a filtered entry says what filters it (the listing test, test_listing_rights.py)
            assert not e.filtered or all(listing_for(k, v) for v in versions), \
                f"{api_name(k)} {e.versions} is filtered but declares no listing in LISTINGS"


# ------------------------------------------------------------------ requests from the schemas

def request_for(api: int, version: int):
    version = schema_version(api, version)
    return version, _override(api, build(entities.entity_class(api, version, "request")))


def _override(api: int, r):
    overrides = {   # where the type's zero is not the resource the table names
        ApiKey.FIND_COORDINATOR: {"key": GROUP_NAME, "key_type": 0, "coordinator_keys": (GROUP_NAME,)},
        ApiKey.DESCRIBE_CONFIGS: {},
        ApiKey.INIT_PRODUCER_ID: {"transactional_id": None, "producer_id": -1},
        **{k: {"group_id": SHARE_GROUP_NAME} for k in SHARE_GROUP_APIS},
    }.get(api, {})
    names = {f.name for f in dataclasses.fields(r)}
    return dataclasses.replace(r, **{k: v for k, v in overrides.items() if k in names})


# ------------------------------------------------------------------ the generated test

CASES = [(k, e.versions[1], e) for k, entries in sorted(API_RIGHTS.items()) for e in entries
         if k not in NOT_GENERATED and not e.open and not e.filtered]


@pytest.fixture
async def rights(tmp_path):
    async with secured_broker(tmp_path / "data") as s:
        TOPIC_ID["id"] = await create_topic(s)
        await commit_offset(s, GROUP_NAME)   # the group exists, so group APIs reach their topic checks

        async def grant(granted: set[Right], take: bool = False, names=NAMES) -> None:
            if take:
                await s.take_all(names.items())
            else:
                await s.grant((g, names[g.resource]) for g in granted)

        async def share_group() -> dict:
            """The share group of SHARE_GROUP_APIS (made by admin); the names to grant rights on."""
            at = entities.nested(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, "request", "AlterShareGroupOffsetsRequestTopic")
            ap = entities.nested(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, "request",
                                 "AlterShareGroupOffsetsRequestPartition")
            r = await s.admin.call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, group_id=SHARE_GROUP_NAME, topics=(
                at(topic_name=TOPIC_NAME, partitions=(ap(partition_index=0, start_offset=0),)),))
            assert int(r.error_code) == 0 and int(r.responses[0].partitions[0].error_code) == 0
            return {**NAMES, ResourceType.GROUP: SHARE_GROUP_NAME}

        yield await s.login("alice"), grant, share_group


def _needed(e: ApiRights) -> set[Right]:
    return set(e.all_of) | {alternatives[0] for alternatives in e.any_of}


@pytest.mark.parametrize("api,version,entry", CASES, ids=[f"{api_name(k)}-v{v}" for k, v, _e in CASES])
async def test_an_api_needs_every_right_it_declares_and_no_other(rights, api, version, entry):
    alice, grant, share_group = rights
    version, request = request_for(api, version)
    names = await share_group() if api in SHARE_GROUP_APIS else NAMES

    async def codes() -> set[int]:
        return auth_codes(await alice.call(api, version, **fields_of(request)))
    assert await codes(), f"{api_name(api)} v{version} answered a principal without rights with no refusal"
    if entry.broker_only:
        await grant({Right(AclOperation.ALL, ResourceType.CLUSTER)})
        assert await codes(), "no ACL stands in for the broker principal"
        await grant(set(), take=True)
        return
    needed = _needed(entry)
    await grant(needed, names=names)
    assert not await codes(), f"{api_name(api)} v{version} refused with every right it declares: {needed}"
    await grant(set(), take=True, names=names)
    for missing in needed:
        alternatives = next((alts for alts in entry.any_of if missing in alts), ())
        await grant(needed - {missing}, names=names)
        if not alternatives:
            assert await codes(), f"{api_name(api)} v{version} answered without {missing}"
        await grant(set(), take=True, names=names)


# ------------------------------------------------------------------ the SASL exchange (`pre_auth`)

def _pre_auth_request(api: int, version: int):
    """The request the generated tests send, a login's own where the schema's zero would not log
    in (alice's PLAIN token)."""
    version, request = request_for(api, version)
    names = {f.name for f in dataclasses.fields(request)}
    overrides = {"mechanism": "PLAIN", "auth_bytes": client_token("alice", USERS["alice"])}
    return version, dataclasses.replace(request, **{k: v for k, v in overrides.items() if k in names})


async def _login_steps(c: AsyncRawConnection, steps: int) -> None:
    """The first `steps` requests of a login (PRE_AUTH_ORDER), each answered without an error."""
    for api in PRE_AUTH_ORDER[:steps]:
        version, request = _pre_auth_request(api, BROKER_VERSIONS[api][1])
        assert int((await c.call(api, version, **fields_of(request))).error_code) == E.NONE, api_name(api)


async def _answer(c: AsyncRawConnection, api: int, version: int):
    """The decoded answer to `api`, or None when the connection closed without one."""
    version, request = _pre_auth_request(api, version)
    try:
        body = await asyncio.wait_for(c.exchange(api, version, entities.encode(request)), 10)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return entities.decode_response(api, version, body)


@pytest.fixture
async def sasl(tmp_path):
    async with secured_broker(tmp_path / "data") as s:
        conns: list[AsyncRawConnection] = []

        async def connect() -> AsyncRawConnection:
            conns.append(await AsyncRawConnection.open(s.host, s.port))
            return conns[-1]

        yield s, connect
        for c in conns:
            await c.close()


SERVED = [(k, BROKER_VERSIONS[k][1]) for k in sorted(BROKER_VERSIONS)]


@pytest.mark.parametrize("api,version", SERVED, ids=[f"{api_name(k)}-v{v}" for k, v in SERVED])
async def test_before_authentication_only_the_login_is_served(sasl, api, version):
    """The generated SASL exchange: a `pre_auth` API is answered at its place in the login; any
    other is refused at every place of it: before anything, after ApiVersions (the connection
    closes unanswered), after the handshake (answered ILLEGAL_SASL_STATE at most, then closed),
    so no handler ever serves a principal nobody authenticated."""
    _s, connect = sasl
    entry = rights_for(api, version)
    assert entry is not None
    if entry.pre_auth:
        c = await connect()
        await _login_steps(c, PRE_AUTH_ORDER.index(api))
        answer = await _answer(c, api, version)
        assert answer is not None, f"{api_name(api)} v{version} not answered at its place in the login"
        assert error_codes(answer) == {E.NONE}, answer
        return
    for steps in range(len(PRE_AUTH_ORDER)):
        c = await connect()
        await _login_steps(c, steps)
        answer = await _answer(c, api, version)
        if steps < PRE_AUTH_ORDER.index(ApiKey.SASL_AUTHENTICATE):
            assert answer is None, f"{api_name(api)} v{version} answered after {steps} login steps: {answer}"
        else:   # Kafka's "Unexpected Kafka request ... during SASL authentication": the refusal, then closed
            assert answer is None or error_codes(answer) == {E.ILLEGAL_SASL_STATE}, answer
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await asyncio.wait_for(c.call(ApiKey.API_VERSIONS, 3, client_software_name="x",
                                              client_software_version="1"), 10)


@pytest.mark.parametrize("api", PRE_AUTH_ORDER, ids=[api_name(k) for k in PRE_AUTH_ORDER])
async def test_after_authentication_the_login_apis_need_no_right_and_grant_nothing(sasl, api):
    """Logged in as alice, who holds no right: ApiVersions is answered; SaslHandshake and
    SaslAuthenticate are answered ILLEGAL_SASL_STATE (no re-authentication was asked), and the
    connection stays alice's, with no more rights than before."""
    s, _connect = sasl
    alice = await s.login("alice")
    answer = await _answer(alice, api, BROKER_VERSIONS[api][1])
    assert answer is not None
    assert error_codes(answer) == ({E.NONE} if api == ApiKey.API_VERSIONS else {E.ILLEGAL_SASL_STATE}), answer
    topic = entities.nested(ApiKey.METADATA, 12, "request", "MetadataRequestTopic")
    r = await alice.call(ApiKey.METADATA, 12, topics=(topic(name=TOPIC_NAME, topic_id=None),),
                         allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    assert int(r.topics[0].error_code) == E.TOPIC_AUTHORIZATION_FAILED
