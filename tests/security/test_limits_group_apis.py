"""Issue 36, resource bounds per principal for the KIP-848 group APIs: a client with nothing but
READ and DESCRIBE on its own groups (`mallory`) cannot make the broker do unbounded work in one
step of its event loop, or hold unbounded memory. What is asserted is each bound's mechanism (the
refusal and its code, what is kept), never a time: bench/group_flood.py measures the stalls.

- ConsumerGroupHeartbeat: a join's work and bytes are flat in the group's size
  (tests/broker/test_consumer_group_records.py), a group holds at most `group.consumer.max.size`
  members (GROUP_MAX_SIZE_REACHED), a member's record at most `message.max.bytes` and a regex
  lives only while a member uses it (test_group_regex_memory.py).
- ConsumerGroupDescribe: a group id repeated in one request is described once (the other entries
  INVALID_REQUEST, as Kafka answers duplicates in CreateTopics and ListOffsets): one request
  naming a group of a thousand members ten thousand times made an answer of gigabytes on the
  event loop; and other clients are served between two groups of one request.

In-process broker over real sockets (the test's event loop is the broker's), SASL PLAIN users."""
from __future__ import annotations

import asyncio
import uuid

import pytest
from tests.security.rights_support import create_topic, secured_broker

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.raw_client import AsyncRawConnection

HB, DESCRIBE_CG = ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE
USERS = {"admin": "admin-pw", "mallory": "mallory-pw", "bob": "bob-pw"}
TOPIC, GROUP, LITERAL, PREFIXED, READ, DESCRIBE, ALLOW = 2, 3, 3, 4, 3, 8, 3


@pytest.fixture
async def secured(tmp_path, request):
    async with secured_broker(tmp_path / "data", USERS, **getattr(request, "param", {})) as s:
        await create_topic(s, "m-t", 4)
        acl = entities.nested(ApiKey.CREATE_ACLS, 3, "request", "AclCreation")
        r = await s.admin.call(ApiKey.CREATE_ACLS, 3, creations=tuple(
            acl(resource_type=rtype, resource_name=name, resource_pattern_type=PREFIXED, principal="User:mallory",
                host="*", operation=op, permission_type=ALLOW)
            for rtype, name, op in ((GROUP, "m-", READ), (TOPIC, "m-", DESCRIBE))))
        assert all(int(x.error_code) == 0 for x in r.results)
        yield s.broker, s.login


async def join(conn: AsyncRawConnection, group: str) -> int:
    r = await conn.call(HB, 1, group_id=group, member_id=str(uuid.uuid4()), member_epoch=0, instance_id=None,
                        rack_id=None, rebalance_timeout=30000, subscribed_topic_names=("m-t",),
                        subscribed_topic_regex=None, server_assignor=None, topic_partitions=())
    return int(r.error_code)


async def test_a_group_repeated_in_one_describe_is_described_once(secured):
    broker, login = secured
    mallory = await login("mallory")
    for _ in range(50):
        assert await join(mallory, "m-big") == E.NONE
    r = await mallory.call(DESCRIBE_CG, 1, group_ids=("m-big",) * 2000 + ("m-none",),
                           include_authorized_operations=False)
    codes = [int(g.error_code) for g in r.groups]
    assert codes[0] == E.NONE and len(r.groups[0].members) == 50
    assert codes[1:2000] == [E.INVALID_REQUEST] * 1999          # no member described twice
    assert sum(len(g.members) for g in r.groups) == 50
    assert codes[2000] == E.GROUP_ID_NOT_FOUND


async def test_other_clients_are_served_between_two_groups_of_one_describe(secured, monkeypatch):
    """The test's loop is the broker's: a Describe of many groups, then another client's
    ApiVersions; the broker finishes the ApiVersions before the Describe, since the handler lets
    the loop run between two groups (it ran the whole request in one step)."""
    broker, login = secured
    mallory, bob = await login("mallory"), await login("bob")
    for i in range(20):
        assert await join(mallory, f"m-g{i}") == E.NONE
    handled: list[int] = []
    observe = broker.metrics.request_handled

    def record(api_key, *args, **kw):
        handled.append(int(api_key))
        return observe(api_key, *args, **kw)

    monkeypatch.setattr(broker.metrics, "request_handled", record)
    describe = asyncio.ensure_future(mallory.call(DESCRIBE_CG, 1, group_ids=tuple(f"m-g{i % 20}-{i}" if i >= 20
                                                                                    else f"m-g{i}"
                                                                                    for i in range(3000)),
                                                  include_authorized_operations=False))
    await asyncio.sleep(0)            # the Describe is sent first
    versions = asyncio.ensure_future(bob.call(ApiKey.API_VERSIONS, 3, client_software_name="t",
                                              client_software_version="1"))
    await versions
    r = await describe
    assert handled == [ApiKey.API_VERSIONS, DESCRIBE_CG], handled   # the order the broker answered them
    assert [int(g.error_code) for g in r.groups[:20]] == [E.NONE] * 20


@pytest.mark.parametrize("secured", [{"group.consumer.max.size": "5"}], indirect=True)
async def test_a_principal_cannot_grow_a_group_past_its_maximum(secured):
    broker, login = secured
    mallory = await login("mallory")
    for _ in range(5):
        assert await join(mallory, "m-g") == E.NONE
    for _ in range(20):
        assert await join(mallory, "m-g") == E.GROUP_MAX_SIZE_REACHED
    assert len(broker.groups.consumer.groups["m-g"].members) == 5
    assert len(broker.groups.consumer.sessions) == 5               # no timer kept for a refused member


async def test_a_member_record_is_bounded_by_the_offsets_topics_maximum(secured):
    broker, login = secured
    mallory = await login("mallory")
    r = await mallory.call(HB, 1, group_id="m-g", member_id=str(uuid.uuid4()), member_epoch=0, instance_id=None,
                           rack_id=None, rebalance_timeout=30000, subscribed_topic_names=None,
                           subscribed_topic_regex="m-[" + "a" * 1_100_000 + "]", server_assignor=None,
                           topic_partitions=())
    assert int(r.error_code) == E.UNKNOWN_SERVER_ERROR
    assert broker.groups.consumer.group("m-g") is None
