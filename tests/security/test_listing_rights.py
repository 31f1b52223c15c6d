"""Listings in the authorization table (`core.security.api_rights.LISTINGS`, issue 36): an answer
that names resources the request did not name one by one (all topics, all groups, a regex's
matches, a transaction's partitions) is filtered, not refused. A test generated from the
declarations sends every listing API, at every version served, as alice with the rights that
reach it: the resource is absent from the answer without the right that shows it, present with
it (and with the right that shows everything, where there is one); a filtered answer carries no
authorization error, a `whole` one refuses what would list the hidden resource. Kafka's
AuthorizerIntegrationTest: testListGroupApiWithAndWithoutListGroupAcls,
testListTransactionsAuthorization, shouldNotIncludeUnauthorizedTopicsInDescribeTransactionsResponse,
testOffsetFetchMultipleGroupsAuthorization (null topics), testMetadataRequest... (all topics).

Which answers are listings is read from the APIs' schemas (kio types): an answer naming topics,
groups or transactional ids that its request does not name, a request that may name them by a
null array (null: all of them) or by a regex. Each such API and version is declared in LISTINGS
or, with why it is not one, below; a listing served without a declaration fails the coverage test.

One in-process broker for the module, over real sockets; admin (a super user) makes a topic, a
group with a committed offset, an open transaction on the topic, a consumer group and a share
group subscribed to it, then grants and takes alice's rights."""
from __future__ import annotations

import dataclasses
import typing
import uuid
from types import UnionType

import pytest
import pytest_asyncio
from kio.schema import types as kt
from tests.security.rights_support import (
    CLUSTER_NAME,
    GROUP_NAME,
    TOPIC_NAME,
    TXN_NAME,
    auth_codes,
    build,
    commit_offset,
    create_topic,
    fields_of,
    init_producer_id,
    schema_version,
    secured_broker,
)

from oncelog.core.security.acl import ResourceType
from oncelog.core.security.api_rights import LISTINGS, Listing, listing_for
from oncelog.protocol import entities
from oncelog.protocol.api import BROKER_VERSIONS, ApiKey, api_name
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.raw_client import AsyncRawConnection

K = ApiKey
TOPIC, GROUP, TXN, CLUSTER = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID,
                              ResourceType.CLUSTER)
# each group listing reads a group of its kind
GROUPS = {K.OFFSET_FETCH: GROUP_NAME, K.LIST_GROUPS: GROUP_NAME, K.CONSUMER_GROUP_DESCRIBE: "rights-cg",
          K.SHARE_GROUP_DESCRIBE: "rights-share", K.CONSUMER_GROUP_HEARTBEAT: "rights-regex",
          K.DESCRIBE_SHARE_GROUP_OFFSETS: "rights-share-offsets"}
ALL_NAMES = [(TOPIC, TOPIC_NAME), (TXN, TXN_NAME), (CLUSTER, CLUSTER_NAME)] + [(GROUP, g) for g in set(GROUPS.values())]

# shaped like a listing by its schema, and why it is not one
NOT_LISTINGS = {
    (K.CONSUMER_GROUP_HEARTBEAT, 0): "v0 has no regex; null topic names mean 'unchanged since the last heartbeat', "
                                     "and each name is checked (DESCRIBE T, refused TOPIC_AUTHORIZATION_FAILED)",
    (K.SHARE_GROUP_HEARTBEAT, 1): "no regex; null topic names mean 'unchanged since the last heartbeat', and each "
                                  "name is checked (DESCRIBE T, refused TOPIC_AUTHORIZATION_FAILED)",
}
_RESOURCES = {kt.TopicName: TOPIC, kt.GroupId: GROUP, kt.TransactionalId: TXN}


# ------------------------------------------------------------------ which answers are listings

def _unwrap(hint) -> tuple[object, bool, bool]:
    """(the item type, nullable, array)."""
    nullable = array = False
    while True:
        origin = typing.get_origin(hint)
        if origin in (typing.Union, UnionType):
            args = typing.get_args(hint)
            nullable = nullable or type(None) in args
            hint = next(a for a in args if a is not type(None))
        elif origin is tuple:
            array, hint = True, typing.get_args(hint)[0]
        else:
            return hint, nullable, array


def _names(cls, under_null_array: bool = False, out=None) -> dict[ResourceType, bool]:
    """The resource types an entity's fields name -> named only under a null-able array (a
    request's null = all) or through a regex."""
    out = {} if out is None else out
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        item, nullable, array = _unwrap(hints[f.name])
        listed = under_null_array or (nullable and array)
        rtype = _RESOURCES.get(item) or (TOPIC if item is uuid.UUID and "topic" in f.name else None)
        if rtype is not None:
            out[rtype] = out.get(rtype, True) and listed
        if "regex" in f.name:
            out[TOPIC] = True
        if dataclasses.is_dataclass(item):
            _names(item, listed, out)
    return out


def listing_shaped(api: int, version: int) -> list[str]:
    """Why the schema of (api, version) allows a listing; [] if it does not."""
    v = schema_version(api, version)
    asked = _names(entities.entity_class(api, v, "request"))
    answered = _names(entities.entity_class(api, v, "response"))
    why = [f"its answer names {t.name} its request does not" for t in answered if t not in asked]
    why += [f"its request names {t.name} by a null array or a regex" for t, listed in asked.items() if listed]
    return why


def test_every_listing_is_declared():
    undeclared, declared_not_served, stale = [], [], []
    for api, (lo, hi) in sorted(BROKER_VERSIONS.items()):
        for v in range(lo, hi + 1):
            why = listing_shaped(api, v)
            if why and listing_for(api, v) is None and (api, v) not in NOT_LISTINGS:
                undeclared.append((api_name(api), v, why))
            if not why and (api, v) in NOT_LISTINGS:
                stale.append((api_name(api), v))
    for api, entries in LISTINGS.items():
        for e in entries:
            lo, hi = BROKER_VERSIONS.get(api, (0, -1))
            if not lo <= e.versions[0] <= e.versions[1] <= hi:
                declared_not_served.append((api_name(api), e.versions))
    assert undeclared == [], f"listings served without a declaration in api_rights.LISTINGS: {undeclared}"
    assert declared_not_served == [], f"listings declared beyond the versions served: {declared_not_served}"
    assert stale == [], f"NOT_LISTINGS names what no longer looks like a listing: {stale}"


def test_the_detector_sees_the_listings_it_must():
    """The coverage test above is only as good as `listing_shaped`: each kind it must see."""
    assert listing_shaped(K.METADATA, 12) and listing_shaped(K.METADATA, 1)          # null topics
    assert listing_shaped(K.LIST_GROUPS, 5) and listing_shaped(K.LIST_TRANSACTIONS, 1)   # nothing named
    assert listing_shaped(K.DESCRIBE_TRANSACTIONS, 0)                               # what a named one holds
    assert listing_shaped(K.CONSUMER_GROUP_HEARTBEAT, 1)                            # a regex
    assert not listing_shaped(K.OFFSET_FETCH, 1)     # v1 names its topics; null (all) from v2
    assert not listing_shaped(K.PRODUCE, 9) and not listing_shaped(K.DESCRIBE_GROUPS, 5)


# ------------------------------------------------------------------ the world the listings show

async def _heartbeat(conn: AsyncRawConnection, group: str, member_id: str, epoch: int, **fields):
    if epoch == 0:
        fields = {"rebalance_timeout": 30000, **fields}
    return await conn.call(K.CONSUMER_GROUP_HEARTBEAT, 1, group_id=group, member_id=member_id, member_epoch=epoch,
                           instance_id=None, topic_partitions=(),
                           **{"subscribed_topic_names": None, "subscribed_topic_regex": None, **fields})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory):
    async with secured_broker(tmp_path_factory.mktemp("listings") / "data") as s:
        topic_id = await create_topic(s)
        await commit_offset(s, GROUP_NAME)
        # an open transaction on the topic, for a while longer than the module runs
        r = await init_producer_id(s.admin, TXN_NAME, 600000)
        assert int(r.error_code) == E.NONE
        tp = entities.nested(K.ADD_PARTITIONS_TO_TXN, 3, "request", "AddPartitionsToTxnTopic")
        a = await s.admin.call(K.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id=TXN_NAME,
                               v3_and_below_producer_id=r.producer_id, v3_and_below_producer_epoch=r.producer_epoch,
                               v3_and_below_topics=(tp(name=TOPIC_NAME, partitions=(0,)),))
        assert int(a.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code) == E.NONE
        # a consumer group and a share group subscribed to the topic
        r = await _heartbeat(s.admin, GROUPS[K.CONSUMER_GROUP_DESCRIBE], str(uuid.uuid4()), 0,
                             subscribed_topic_names=(TOPIC_NAME,))
        assert int(r.error_code) == E.NONE
        r = await s.admin.call(K.SHARE_GROUP_HEARTBEAT, 1, group_id=GROUPS[K.SHARE_GROUP_DESCRIBE],
                               member_id=str(uuid.uuid4()), member_epoch=0, rack_id=None,
                               subscribed_topic_names=(TOPIC_NAME,))
        assert int(r.error_code) == E.NONE
        # an empty share group with a state on the topic (its start offset set by admin)
        at = entities.nested(K.ALTER_SHARE_GROUP_OFFSETS, 0, "request", "AlterShareGroupOffsetsRequestTopic")
        ap = entities.nested(K.ALTER_SHARE_GROUP_OFFSETS, 0, "request", "AlterShareGroupOffsetsRequestPartition")
        r = await s.admin.call(K.ALTER_SHARE_GROUP_OFFSETS, 0, group_id=GROUPS[K.DESCRIBE_SHARE_GROUP_OFFSETS],
                               topics=(at(topic_name=TOPIC_NAME, partitions=(ap(partition_index=0, start_offset=0),)),))
        assert int(r.error_code) == E.NONE and int(r.responses[0].partitions[0].error_code) == E.NONE
        yield s, await s.login("alice"), topic_id


# ------------------------------------------------------------------ the listing requests

def listing_request(api: int, version: int):
    """(version sent, request) asking for the listing: built from the schema, then the fields
    that make it one."""
    version = schema_version(api, version)
    r = build(entities.entity_class(api, version, "request"))
    group = GROUPS.get(api, GROUP_NAME)
    changes: dict = {
        K.METADATA: {"topics": () if version == 0 else None, "allow_auto_topic_creation": False,
                     "include_topic_authorized_operations": False, "include_cluster_authorized_operations": False},
        K.OFFSET_FETCH: {"group_id": group, "topics": None, "require_stable": False},
        K.LIST_GROUPS: {"states_filter": (), "types_filter": ()},
        K.DESCRIBE_LOG_DIRS: {"topics": None},
        K.DESCRIBE_TRANSACTIONS: {"transactional_ids": (TXN_NAME,)},
        K.LIST_TRANSACTIONS: {"state_filters": (), "producer_id_filters": (), "duration_filter": -1},
        K.CONSUMER_GROUP_DESCRIBE: {"group_ids": (group,), "include_authorized_operations": False},
        K.SHARE_GROUP_DESCRIBE: {"group_ids": (group,), "include_authorized_operations": False},
    }.get(api, {})
    names = {f.name for f in dataclasses.fields(r)}
    if api == K.DESCRIBE_SHARE_GROUP_OFFSETS:   # a batch of groups, each with topics null: all
        g = entities.nested(api, version, "request", "DescribeShareGroupOffsetsRequestGroup")
        changes["groups"] = (g(group_id=group, topics=None),)
    if api == K.OFFSET_FETCH and "groups" in names:   # v8+: a batch of groups
        g = build(entities.nested(api, version, "request", "OffsetFetchRequestGroup"))
        changes["groups"] = (dataclasses.replace(g, group_id=group, topics=None, **{
            k: v for k, v in (("member_id", None), ("member_epoch", -1)) if hasattr(g, k)}),)
    return version, dataclasses.replace(r, **{k: v for k, v in changes.items() if k in names})


async def ask(alice: AsyncRawConnection, api: int, version: int) -> list:
    """The answers to one listing: one request, or a regex member's heartbeats."""
    if api == K.CONSUMER_GROUP_HEARTBEAT:
        member, group = str(uuid.uuid4()), GROUPS[api]
        answers = [await _heartbeat(alice, group, member, 0, subscribed_topic_regex="rights-.*")]
        epoch = int(answers[0].member_epoch)
        for _ in range(4):   # a regex is resolved after the heartbeat that brings it
            answers.append(await _heartbeat(alice, group, member, epoch))
            epoch = int(answers[-1].member_epoch)
            if answers[-1].assignment is not None and answers[-1].assignment.topic_partitions:
                break
        await _heartbeat(alice, group, member, -1)   # leaves: the next probe starts from an empty group
        return answers
    version, request = listing_request(api, version)
    return [await alice.call(api, version, **fields_of(request))]


def listed(answers) -> dict[ResourceType, set]:
    """Every resource the answers name, by type (topics by name and by id)."""
    out: dict[ResourceType, set] = {TOPIC: set(), GROUP: set(), TXN: set()}

    def walk(x) -> None:
        if dataclasses.is_dataclass(x):
            hints = typing.get_type_hints(type(x))
            for f in dataclasses.fields(x):
                v = getattr(x, f.name)
                item, _n, _a = _unwrap(hints[f.name])
                rtype = _RESOURCES.get(item) or (TOPIC if item is uuid.UUID and "topic" in f.name else None)
                if rtype is not None and v is not None:
                    out[rtype].update(v if isinstance(v, tuple) else (v,))
                elif isinstance(v, tuple) or dataclasses.is_dataclass(v):
                    walk(v)
        elif isinstance(x, tuple | list):
            for item in x:
                walk(item)
    walk(answers)
    return out


_DENIED = {TOPIC: E.TOPIC_AUTHORIZATION_FAILED, GROUP: E.GROUP_AUTHORIZATION_FAILED,
           TXN: E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, CLUSTER: E.CLUSTER_AUTHORIZATION_FAILED}


# ------------------------------------------------------------------ the generated test

CASES = [(k, v, e) for k, entries in sorted(LISTINGS.items()) for e in entries
         for v in range(e.versions[0], e.versions[1] + 1)]


@pytest.mark.asyncio(loop_scope="module")   # the module's broker runs on the module's loop
@pytest.mark.parametrize("api,version,listing", CASES, ids=[f"{api_name(k)}-v{v}" for k, v, _e in CASES])
async def test_a_listing_shows_a_resource_only_with_the_right_that_shows_it(world, api, version, listing: Listing):
    s, alice, topic_id = world
    target = {TOPIC: {TOPIC_NAME, topic_id}, GROUP: {GROUPS.get(api, GROUP_NAME)}, TXN: {TXN_NAME}}[listing.lists]

    def name(resource: ResourceType) -> str:
        return {TOPIC: TOPIC_NAME, GROUP: GROUPS.get(api, GROUP_NAME), TXN: TXN_NAME,
                CLUSTER: CLUSTER_NAME}[resource]

    reach = [(r, name(r.resource)) for r in listing.reach]

    async def shown(granted) -> bool:
        await s.take_all(ALL_NAMES)
        await s.grant(reach + granted)
        answers = await ask(alice, api, version)
        codes = auth_codes(answers)
        present = bool(listed(answers)[listing.lists] & target)
        if not present and listing.whole:
            assert codes == {_DENIED[listing.shown_by.resource]}, \
                f"{api_name(api)} v{version}: a whole listing refuses with {listing.shown_by}'s code, not {codes}"
        else:
            assert codes == set(), f"{api_name(api)} v{version}: a listing refused something: {codes} {answers}"
        return present

    try:
        assert not await shown([]), f"{api_name(api)} v{version} listed {target} without {listing.shown_by}"
        assert await shown([(listing.shown_by, name(listing.shown_by.resource))]), \
            f"{api_name(api)} v{version} did not list {target} with {listing.shown_by}"
        if listing.all_by is not None:
            assert await shown([(listing.all_by, CLUSTER_NAME)]), \
                f"{api_name(api)} v{version} did not list {target} with {listing.all_by}"
    finally:
        await s.take_all(ALL_NAMES)


def test_the_answers_name_their_resources_in_typed_fields():
    """`listed` reads kio's types: a schema that names a resource in a plain string would hide it
    from the generated test (and the coverage test): the listings' answers name theirs typed."""
    for api, entries in LISTINGS.items():
        for e in entries:
            for v in range(e.versions[0], e.versions[1] + 1):
                answer = entities.entity_class(api, schema_version(api, v), "response")
                assert e.lists in _names(answer), f"{api_name(api)} v{v}'s answer has no typed {e.lists.name}"

