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

import dataclasses

import pytest
from tests.security.rights_support import (
    CLUSTER_NAME,
    GROUP_NAME,
    TOPIC_ID,
    TOPIC_NAME,
    TXN_NAME,
    auth_codes,
    build,
    commit_offset,
    create_topic,
    fields_of,
    schema_version,
    secured_broker,
)

from oncelog.core.security.acl import AclOperation, ResourceType
from oncelog.core.security.api_rights import API_RIGHTS, ApiRights, Right, listing_for, rights_for
from oncelog.protocol import entities
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey, api_name

NAMES = {ResourceType.TOPIC: TOPIC_NAME, ResourceType.GROUP: GROUP_NAME, ResourceType.TRANSACTIONAL_ID: TXN_NAME,
         ResourceType.CLUSTER: CLUSTER_NAME}
# APIs whose group must be an empty share group (the test's group is a classic one, and Kafka
# answers GROUP_ID_NOT_FOUND for it at the top level, without its topics' authorization errors):
# theirs, with a state on the test's topic set by admin before the requests
SHARE_GROUP_NAME = "rights-share-group"
SHARE_GROUP_APIS = {ApiKey.ALTER_SHARE_GROUP_OFFSETS, ApiKey.DELETE_SHARE_GROUP_OFFSETS}
# not generated: the SASL exchange itself, and the requests whose answer the generic request
# cannot reach (named here, with why, so the list is read when it grows)
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
