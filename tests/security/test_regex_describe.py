"""Issue 36, finding 1: regex subscriptions ignored DESCRIBE. alice, with READ on her group and no
right on the `secret-` topics, subscribed with the regex `secret-.*` (ConsumerGroupHeartbeat v1)
and was assigned their partitions; 800 regex probes named them; a regex member took a partition
from bob, who may read it, and held it without being able to fetch it. Kafka filters a regex's
matches by DESCRIBE (KAFKA-18813): so does oncelog, for every member using the regex, at every
resolution (`authorization.topic_visibility`).

Side bug: a regex that resolves to topics the group already subscribes to (by name) did not move
the group epoch, so its member got nothing until some other change.

In-process broker over real sockets, SASL PLAIN users, raw heartbeats."""
from __future__ import annotations

import uuid

import pytest
from tests.security.rights_support import create_topic, secured_broker

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.raw_client import AsyncRawConnection

HB, DESCRIBE_CG = ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE
USERS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}
TOPICS = {"public-orders": 1, "secret-payroll-2026": 2, "secret-mergers": 1}
# resource types, pattern types, operations, permission (core.security.acl)
TOPIC, GROUP, LITERAL, PREFIXED, READ, DESCRIBE, ALLOW = 2, 3, 3, 4, 3, 8, 3


class Member:
    def __init__(self, conn: AsyncRawConnection, group: str = "g") -> None:
        self.conn, self.group, self.member_id = conn, group, str(uuid.uuid4())
        self.epoch, self.owned = 0, {}

    async def heartbeat(self, epoch: int | None = None, **fields) -> int:
        """A heartbeat at the member's epoch (or `epoch`: -1 leaves); applies the answer."""
        tp = entities.nested(HB, 1, "request", "TopicPartitions")
        epoch = self.epoch if epoch is None else epoch
        if epoch == 0:
            fields = {"rebalance_timeout": 30000, **fields}
        r = await self.conn.call(HB, 1, group_id=self.group, member_id=self.member_id, member_epoch=epoch,
                                 instance_id=None, **{"subscribed_topic_names": None,
                                                      "subscribed_topic_regex": None, **fields},
                                 topic_partitions=tuple(tp(topic_id=t, partitions=tuple(sorted(ps)))
                                                        for t, ps in self.owned.items() if ps))
        code = int(r.error_code)
        if code == E.NONE and epoch >= 0:
            self.epoch = int(r.member_epoch)
            if r.assignment is not None:
                self.owned = {t.topic_id: set(t.partitions) for t in r.assignment.topic_partitions}
        return code

    def count(self) -> int:
        return sum(len(ps) for ps in self.owned.values())


@pytest.fixture
async def secured(tmp_path):
    async with secured_broker(tmp_path / "data", USERS) as s:
        ids = {t: await create_topic(s, t, n) for t, n in TOPICS.items()}
        acl = entities.nested(ApiKey.CREATE_ACLS, 3, "request", "AclCreation")

        def allow(user, rtype, name, pattern, op):
            return acl(resource_type=rtype, resource_name=name, resource_pattern_type=pattern,
                       principal=f"User:{user}", host="*", operation=op, permission_type=ALLOW)

        r = await s.admin.call(ApiKey.CREATE_ACLS, 3, creations=(
            allow("alice", GROUP, "g", LITERAL, READ), allow("bob", GROUP, "g", LITERAL, READ),
            allow("alice", TOPIC, "public-", PREFIXED, READ),
            allow("bob", TOPIC, "secret-payroll-2026", LITERAL, READ)))
        assert all(int(x.error_code) == 0 for x in r.results)
        yield s.broker, s.login, s.admin, ids


async def assigned_topics(admin: AsyncRawConnection, ids, member: Member) -> set[str]:
    names = {v: k for k, v in ids.items()}
    r = await admin.call(DESCRIBE_CG, 1, group_ids=(member.group,), include_authorized_operations=False)
    [m] = [m for m in r.groups[0].members if m.member_id == member.member_id]
    return {names[t.topic_id] for t in m.assignment.topic_partitions}


async def test_a_regex_matches_only_the_topics_the_member_may_describe(secured):
    _broker, login, admin, ids = secured
    alice = Member(await login("alice"))
    # by name: refused, as before
    assert await alice.heartbeat(subscribed_topic_names=("secret-payroll-2026",)) == E.TOPIC_AUTHORIZATION_FAILED
    assert await alice.heartbeat(subscribed_topic_regex="secret-.*|public-.*") == E.NONE
    for _ in range(3):   # a new regex is resolved after the heartbeat that brings it
        assert await alice.heartbeat() == E.NONE
    assert set(alice.owned) == {ids["public-orders"]} and alice.count() == 1
    assert await assigned_topics(admin, ids, alice) == {"public-orders"}
    # a regex matching only hidden topics: nothing, the same answer as a regex matching no topic
    probe = Member(await login("alice"))
    assert await probe.heartbeat(subscribed_topic_regex="secret-payroll-.*") == E.NONE
    for _ in range(2):
        assert await probe.heartbeat() == E.NONE
    assert probe.owned == {} and await assigned_topics(admin, ids, probe) == set()


async def test_a_regex_member_takes_nothing_from_a_member_that_may_read_it(secured):
    _broker, login, admin, ids = secured
    bob = Member(await login("bob"))
    assert await bob.heartbeat(subscribed_topic_names=("secret-payroll-2026",)) == E.NONE
    alice = Member(await login("alice"))
    assert await alice.heartbeat(subscribed_topic_regex="secret-.*") == E.NONE
    for _ in range(4):
        for m in (alice, bob):
            assert await m.heartbeat() == E.NONE
    assert alice.owned == {} and await assigned_topics(admin, ids, alice) == set()
    assert bob.owned == {ids["secret-payroll-2026"]: {0, 1}}
    # bob's heartbeats (he may describe the topic) resolve the regex again: still within alice's rights
    assert await bob.heartbeat() == E.NONE and await alice.heartbeat() == E.NONE
    assert alice.owned == {}
    # an ACL given to alice takes effect at the next resolution
    acl = entities.nested(ApiKey.CREATE_ACLS, 3, "request", "AclCreation")
    r = await admin.call(ApiKey.CREATE_ACLS, 3, creations=(acl(
        resource_type=TOPIC, resource_name="secret-payroll-2026", resource_pattern_type=LITERAL,
        principal="User:alice", host="*", operation=DESCRIBE, permission_type=ALLOW),))
    assert int(r.results[0].error_code) == 0
    for _ in range(6):
        for m in (alice, bob):
            assert await m.heartbeat() == E.NONE
    assert alice.count() == 1 and bob.count() == 1


async def test_a_regex_resolving_to_topics_the_group_already_has_moves_the_epoch(secured):
    """The side bug: b's regex matches only what a subscribes to by name; the topic metadata of the
    group does not change, but b's subscription does: b must be given its share."""
    _broker, login, _admin, ids = secured
    a, b = Member(await login("bob")), Member(await login("bob"))
    assert await a.heartbeat(subscribed_topic_names=("secret-payroll-2026",)) == E.NONE
    assert await a.heartbeat() == E.NONE and a.count() == 2
    assert await b.heartbeat(subscribed_topic_regex="secret-payroll-.*") == E.NONE
    for _ in range(4):
        for m in (a, b):
            assert await m.heartbeat() == E.NONE
    assert a.count() == 1 and b.count() == 1
