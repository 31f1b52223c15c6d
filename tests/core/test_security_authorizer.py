"""The authorizer and the ACL store: one test per rule (as Kafka's AuthorizerIntegrationTest and
StandardAuthorizerTest check them), Kafka's filter cases, authorizeByResourceType, records and
snapshots, and a Hypothesis machine comparing every decision with a brute-force reading of the
rules over all ACLs."""
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.tiers import examples

from oncelog.core.security.acl import (
    ANY_FILTER,
    AccessControlEntry,
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    from_code,
)
from oncelog.core.security.authorizer import AUTHORIZED_OPERATIONS_OMITTED, Acls, Authorizer, parse_super_users
from oncelog.core.security.principal import KafkaPrincipal
from oncelog.protocol.errors import ErrorCode

TOPIC, GROUP, CLUSTER, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
Op = AclOperation
LOCAL = "127.0.0.1"


def binding(rtype, name, ptype, principal, host, op, perm):
    return AclBinding(ResourcePattern(rtype, name, ptype), AccessControlEntry(principal, host, op, perm))


class Env:
    """An authorizer fed the way the broker will feed it: decided records, replayed."""

    def __init__(self, super_users=(), allow_everyone=False):
        self.ids = (f"id-{i}" for i in itertools.count())
        self.acls = Acls()
        self.authorizer = Authorizer(self.acls, super_users, allow_everyone)

    def add(self, *bindings):
        records, results = self.acls.decide_create(bindings, lambda: next(self.ids))
        assert all(code == ErrorCode.NONE for code, _ in results), results
        for r in records:
            self.acls.replay(r)

    def remove(self, *bindings):
        filters = [AclBindingFilter(
            ResourcePatternFilter(b.pattern.resource_type, b.pattern.name, b.pattern.pattern_type),
            AccessControlEntryFilter(b.entry.principal, b.entry.host, b.entry.operation, b.entry.permission_type))
            for b in bindings]
        records, _ = self.acls.decide_delete(filters)
        for r in records:
            self.acls.replay(r)

    def ok(self, user, op, rtype, name, host=LOCAL):
        return self.authorizer.authorize(KafkaPrincipal.user(user), host, op, rtype, name)


# ------------------------------------------------------------------ one test per rule

def test_deny_wins_over_allow():
    env = Env()
    env.add(binding(TOPIC, "orders", LITERAL, "User:alice", "*", Op.READ, ALLOW),
            binding(TOPIC, "orders", LITERAL, "User:alice", "*", Op.READ, DENY))
    assert not env.ok("alice", Op.READ, TOPIC, "orders")
    env = Env()   # a DENY for everyone beats an ALLOW for one, from any pattern
    env.add(binding(TOPIC, "orders", LITERAL, "User:alice", "*", Op.ALL, ALLOW),
            binding(TOPIC, "ord", PREFIXED, "User:*", "*", Op.WRITE, DENY))
    assert not env.ok("alice", Op.WRITE, TOPIC, "orders")
    assert env.ok("alice", Op.READ, TOPIC, "orders")


def test_deny_precedence_with_operation_all():
    # StandardAuthorizerTest.testDenyPrecedenceWithOperationAll
    env = Env()
    env.add(binding(TOPIC, "foo", LITERAL, "User:alice", "*", Op.ALL, DENY),
            binding(TOPIC, "foo", PREFIXED, "User:alice", "*", Op.READ, ALLOW),
            binding(TOPIC, "foo", LITERAL, "User:*", "*", Op.ALL, DENY),
            binding(TOPIC, "foo", PREFIXED, "User:*", "*", Op.DESCRIBE, ALLOW))
    assert [env.ok("alice", op, TOPIC, n) for op, n in
            [(Op.WRITE, "foo"), (Op.READ, "foo"), (Op.DESCRIBE, "foo"), (Op.READ, "foobar")]
            ] == [False, False, False, True]
    assert [env.ok("bob", op, TOPIC, n) for op, n in
            [(Op.DESCRIBE, "foo"), (Op.READ, "foo"), (Op.WRITE, "foo"), (Op.DESCRIBE, "foobaz"), (Op.READ, "foobaz")]] \
        == [False, False, False, True, False]


def test_prefixed_patterns():
    # StandardAuthorizerTest.testPrefixAcls
    env = Env()
    env.add(binding(TOPIC, "fooa", PREFIXED, "User:alice", "*", Op.ALL, ALLOW),
            binding(TOPIC, "foobar", LITERAL, "User:bob", "*", Op.ALL, ALLOW),
            binding(TOPIC, "f", PREFIXED, "User:bob", "*", Op.ALL, ALLOW))
    assert [env.ok("bob", Op.WRITE, TOPIC, "foobarr"), env.ok("bob", Op.READ, TOPIC, "goobar"),
            env.ok("bob", Op.READ, TOPIC, "fooa")] == [True, False, True]
    assert [env.ok("alice", Op.DESCRIBE, TOPIC, "fooa"), env.ok("alice", Op.WRITE, TOPIC, "bar"),
            env.ok("alice", Op.READ, TOPIC, "baz")] == [True, False, False]
    # a literal name is not a prefix
    env.add(binding(TOPIC, "lit", LITERAL, "User:carol", "*", Op.READ, ALLOW))
    assert env.ok("carol", Op.READ, TOPIC, "lit") and not env.ok("carol", Op.READ, TOPIC, "literal")


@pytest.mark.parametrize("granted", [Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER])
def test_implied_describe(granted):
    env = Env()
    env.add(binding(TOPIC, "foo_", PREFIXED, "User:bob", "*", granted, ALLOW))
    assert env.ok("bob", Op.DESCRIBE, TOPIC, "foo_bar")


def test_what_is_not_implied():
    env = Env()
    env.add(binding(TOPIC, "foo_", PREFIXED, "User:bob", "*", Op.CREATE, ALLOW))
    assert not env.ok("bob", Op.DESCRIBE, TOPIC, "foo_bar")
    env = Env()   # DENY implies nothing: DENY READ leaves DESCRIBE to the ALLOW
    env.add(binding(TOPIC, "foo_", PREFIXED, "User:bob", "*", Op.READ, DENY),
            binding(TOPIC, "foo_", PREFIXED, "User:bob", "*", Op.DESCRIBE, ALLOW))
    assert env.ok("bob", Op.DESCRIBE, TOPIC, "foo_bar") and not env.ok("bob", Op.READ, TOPIC, "foo_bar")
    env = Env()
    env.add(binding(TOPIC, "t", LITERAL, "User:bob", "*", Op.ALTER_CONFIGS, ALLOW))
    assert env.ok("bob", Op.DESCRIBE_CONFIGS, TOPIC, "t") and not env.ok("bob", Op.DESCRIBE, TOPIC, "t")
    env = Env()
    env.add(binding(TOPIC, "t", LITERAL, "User:bob", "*", Op.ALTER_CONFIGS, DENY),
            binding(TOPIC, "t", LITERAL, "User:bob", "*", Op.DESCRIBE_CONFIGS, ALLOW))
    assert env.ok("bob", Op.DESCRIBE_CONFIGS, TOPIC, "t")


def test_super_users_can_do_everything_even_against_deny():
    env = Env(super_users=parse_super_users(" User:admin ; User:CN=broker,O=x;"))
    env.add(binding(TOPIC, "*", LITERAL, "User:*", "*", Op.ALL, DENY))
    assert env.ok("admin", Op.WRITE, TOPIC, "anything") and env.ok("CN=broker,O=x", Op.CLUSTER_ACTION, CLUSTER,
                                                                    "kafka-cluster")
    assert not env.ok("alice", Op.WRITE, TOPIC, "anything")
    assert env.authorizer.decide(KafkaPrincipal.user("admin"), LOCAL, Op.READ, TOPIC, "x").rule == "SuperUser"


def test_allow_everyone_if_no_acl_found_only_where_no_acl_exists():
    # StandardAuthorizerTest.testAllowEveryoneIfNoAclFoundConfigEnabled / Disabled
    for allow_everyone in (True, False):
        env = Env(super_users={"User:alice", "User:chris"}, allow_everyone=allow_everyone)
        env.add(binding(TOPIC, "topic1", LITERAL, "User:Alice", "*", Op.READ, ALLOW))
        assert not env.ok("Bob", Op.READ, TOPIC, "topic1")          # the resource has an ACL
        assert env.ok("Bob", Op.READ, TOPIC, "topic2") is allow_everyone
    env = Env(allow_everyone=True)   # an ACL for any principal or operation counts; a prefix one too
    env.add(binding(TOPIC, "top", PREFIXED, "User:carol", "10.9.9.9", Op.DELETE, ALLOW))
    assert not env.ok("Bob", Op.READ, TOPIC, "topic3")
    assert env.ok("Bob", Op.READ, GROUP, "topic3")


def test_wildcard_resource_and_principal():
    # StandardAuthorizerTest.testTopicAclWithOperationAll
    env = Env()
    env.add(binding(TOPIC, "foo", LITERAL, "User:*", "*", Op.ALL, ALLOW),
            binding(TOPIC, "bar", PREFIXED, "User:alice", "*", Op.ALL, ALLOW),
            binding(TOPIC, "baz", LITERAL, "User:bob", "*", Op.ALL, ALLOW))
    assert [env.ok("alice", Op.WRITE, TOPIC, "foo"), env.ok("alice", Op.DESCRIBE_CONFIGS, TOPIC, "bar"),
            env.ok("alice", Op.DESCRIBE, TOPIC, "baz")] == [True, True, False]
    assert [env.ok("bob", Op.WRITE, TOPIC, "foo"), env.ok("bob", Op.READ, TOPIC, "bar"),
            env.ok("bob", Op.DESCRIBE, TOPIC, "baz")] == [True, False, True]
    assert [env.ok("malory", Op.DESCRIBE, TOPIC, "foo"), env.ok("malory", Op.WRITE, TOPIC, "bar"),
            env.ok("malory", Op.READ, TOPIC, "baz")] == [True, False, False]
    env.add(binding(GROUP, "*", LITERAL, "User:bob", "*", Op.READ, ALLOW))
    assert env.ok("bob", Op.READ, GROUP, "any-group") and not env.ok("alice", Op.READ, GROUP, "any-group")


def test_hosts():
    # StandardAuthorizerTest.testHostAddressAclValidation (local host = 127.0.0.1)
    env = Env()
    env.add(binding(TOPIC, "foo", LITERAL, "User:alice", "192.168.1.1", Op.READ, DENY),
            binding(TOPIC, "foo", LITERAL, "User:alice", "*", Op.READ, ALLOW),
            binding(TOPIC, "bar", LITERAL, "User:bob", "192.168.1.2", Op.READ, ALLOW),
            binding(TOPIC, "bar", LITERAL, "User:*", LOCAL, Op.DESCRIBE, ALLOW))
    actions = [(Op.READ, "foo"), (Op.READ, "bar"), (Op.DESCRIBE, "bar")]
    table = {("alice", LOCAL): [True, False, True], ("alice", "192.168.1.1"): [False, False, False],
             ("alice", "192.168.1.2"): [True, False, False], ("bob", LOCAL): [False, False, True],
             ("bob", "192.168.1.1"): [False, False, False], ("bob", "192.168.1.2"): [False, True, True]}
    for (user, host), expected in table.items():
        assert [env.ok(user, op, TOPIC, n, host=host) for op, n in actions] == expected, (user, host)


def test_ipv6_hosts_written_as_java_prints_them_match():
    env = Env()
    env.add(binding(TOPIC, "t", LITERAL, "User:alice", "0:0:0:0:0:0:0:1", Op.READ, ALLOW))
    assert env.ok("alice", Op.READ, TOPIC, "t", host="::1")
    assert not env.ok("alice", Op.READ, TOPIC, "t", host="::2")


def test_many_acls():
    # StandardAuthorizerTest.testAuthorizationWithManyAcls
    env = Env()
    env.add(binding(TOPIC, "green2", LITERAL, "User:*", "*", Op.READ, ALLOW),
            binding(TOPIC, "green", PREFIXED, "User:bob", "*", Op.READ, ALLOW),
            binding(TOPIC, "betamax4", LITERAL, "User:bob", "*", Op.READ, ALLOW),
            binding(TOPIC, "betamax", LITERAL, "User:bob", "*", Op.READ, ALLOW),
            binding(TOPIC, "beta", PREFIXED, "User:*", "*", Op.READ, ALLOW),
            binding(TOPIC, "alpha", PREFIXED, "User:*", "*", Op.READ, ALLOW),
            binding(TOPIC, "alp", PREFIXED, "User:bob", "*", Op.READ, DENY),
            binding(GROUP, "*", LITERAL, "User:bob", "*", Op.WRITE, ALLOW),
            binding(GROUP, "wheel", LITERAL, "User:*", "*", Op.WRITE, DENY))
    assert [env.ok("bob", Op.READ, TOPIC, "green1"), env.ok("bob", Op.WRITE, GROUP, "wheel")] == [True, False]
    assert [env.ok("bob", Op.READ, TOPIC, "alpha"), env.ok("bob", Op.WRITE, GROUP, "arbitrary"),
            env.ok("bob", Op.READ, TOPIC, "ala")] == [False, True, False]


def test_resource_types_are_separate():
    env = Env()
    env.add(binding(TXN, "tx", PREFIXED, "User:alice", "*", Op.WRITE, ALLOW))
    assert env.ok("alice", Op.WRITE, TXN, "tx-1") and not env.ok("alice", Op.WRITE, TOPIC, "tx-1")


def test_authorized_operations_bitfield():
    env = Env()
    env.add(binding(TOPIC, "t", LITERAL, "User:alice", "*", Op.READ, ALLOW),
            binding(TOPIC, "t", LITERAL, "User:alice", "*", Op.ALTER_CONFIGS, ALLOW))
    bits = env.authorizer.authorized_operations(KafkaPrincipal.user("alice"), LOCAL, TOPIC, "t")
    assert bits == (1 << Op.READ) | (1 << Op.DESCRIBE) | (1 << Op.ALTER_CONFIGS) | (1 << Op.DESCRIBE_CONFIGS)
    admin = Env(super_users={"User:admin"}).authorizer
    assert admin.authorized_operations(KafkaPrincipal.user("admin"), LOCAL, GROUP, "g") == \
        (1 << Op.READ) | (1 << Op.DESCRIBE) | (1 << Op.DELETE) | (1 << Op.DESCRIBE_CONFIGS) | (1 << Op.ALTER_CONFIGS)
    assert AUTHORIZED_OPERATIONS_OMITTED == -2147483648


# ------------------------------------------------------------------ authorizeByResourceType (KIP-679)

def _by_type(env, user, op, rtype, host="192.168.1.1"):
    return env.authorizer.authorize_by_resource_type(KafkaPrincipal.user(user), host, op, rtype)


def test_by_resource_type_add_and_remove():
    env = Env()
    allow = binding(TOPIC, "sb1", LITERAL, "User:user1", "192.168.1.1", Op.READ, ALLOW)
    deny = binding(TOPIC, "sb1", LITERAL, "User:user1", "192.168.1.1", Op.READ, DENY)
    for _ in range(3):
        assert not _by_type(env, "user1", Op.READ, TOPIC)
        env.add(allow)
        assert _by_type(env, "user1", Op.READ, TOPIC)
        for _ in range(3):
            env.add(deny)
            assert not _by_type(env, "user1", Op.READ, TOPIC)
            env.remove(deny)
            env.add(allow)
            assert _by_type(env, "user1", Op.READ, TOPIC)
        env.remove(allow)


def test_by_resource_type_prefixed_deny_dominates():
    env = Env()
    ace = lambda name, perm: binding(GROUP, name, PREFIXED, "User:user1", "192.168.1.1", Op.READ, perm)  # noqa: E731
    steps = [(ace("abcde", ALLOW), True), (ace("abcd", DENY), False), (ace("abc", ALLOW), True),
             (ace("a", DENY), False), (ace("ab", ALLOW), False)]
    for b, expected in steps:
        env.add(b)
        assert _by_type(env, "user1", Op.READ, GROUP) is expected


def test_by_resource_type_wildcard_deny_dominates():
    env = Env()
    ace = lambda name, ptype, perm: binding(GROUP, name, ptype, "User:user1", "192.168.1.1", Op.WRITE, perm)  # noqa
    steps = [(ace("hello", PREFIXED, ALLOW), True), (ace("*", LITERAL, DENY), False),
             (ace("*", LITERAL, ALLOW), False), (ace("aloha", LITERAL, ALLOW), False)]
    for b, expected in steps:
        env.add(b)
        assert _by_type(env, "user1", Op.WRITE, GROUP) is expected


def test_by_resource_type_with_wildcard_principal():
    env = Env()
    h = "192.168.1.1"
    env.add(binding(TOPIC, "sb1", LITERAL, "User:user1", h, Op.READ, ALLOW))
    assert _by_type(env, "user1", Op.READ, TOPIC)
    env.add(binding(TOPIC, "sb1", LITERAL, "User:*", h, Op.READ, DENY))
    assert not _by_type(env, "user1", Op.READ, TOPIC)
    env.add(binding(TOPIC, "sb2", LITERAL, "User:user1", h, Op.READ, DENY))
    assert not _by_type(env, "user1", Op.READ, TOPIC) and not _by_type(env, "user2", Op.READ, TOPIC)
    env.add(binding(TOPIC, "sb2", LITERAL, "User:*", h, Op.READ, ALLOW))
    assert _by_type(env, "user2", Op.READ, TOPIC)
    env.add(binding(TOPIC, "sb2", LITERAL, "User:*", h, Op.READ, DENY))
    assert not _by_type(env, "user2", Op.READ, TOPIC)


def test_by_resource_type_for_super_users_and_allow_everyone():
    assert _by_type(Env(super_users={"User:root"}), "root", Op.IDEMPOTENT_WRITE, CLUSTER)
    assert _by_type(Env(allow_everyone=True), "anyone", Op.WRITE, TOPIC)
    assert not _by_type(Env(), "anyone", Op.WRITE, TOPIC)


# ------------------------------------------------------------------ filters (ResourcePatternFilterTest)

def _p(rtype, name, ptype):
    return ResourcePattern(rtype, name, ptype)


@pytest.mark.parametrize("filt, pattern, expected", [
    ((TOPIC, "Name", LITERAL), (GROUP, "Name", LITERAL), False),
    ((TOPIC, "Different", PREFIXED), (TOPIC, "Name", PREFIXED), False),
    ((TOPIC, "NAME", LITERAL), (TOPIC, "Name", LITERAL), False),
    ((TOPIC, "Name", LITERAL), (TOPIC, "Name", PREFIXED), False),
    ((ResourceType.ANY, "Name", PREFIXED), (TOPIC, "Name", PREFIXED), True),
    ((TOPIC, None, PREFIXED), (TOPIC, "Name", PREFIXED), True),
    ((TOPIC, None, PatternType.ANY), (TOPIC, "Name", PREFIXED), True),
    ((TOPIC, None, PatternType.MATCH), (TOPIC, "Name", PREFIXED), True),
    ((TOPIC, "Name", LITERAL), (TOPIC, "Name", LITERAL), True),
    ((TOPIC, "Name", PatternType.ANY), (TOPIC, "Name", LITERAL), True),
    ((TOPIC, "Name", PatternType.MATCH), (TOPIC, "Name", LITERAL), True),
    ((TOPIC, "Name-something", PatternType.MATCH), (TOPIC, "Name", LITERAL), False),
    ((TOPIC, "*", LITERAL), (TOPIC, "*", LITERAL), True),
    ((TOPIC, "Name", LITERAL), (TOPIC, "*", LITERAL), False),
    ((TOPIC, "*", LITERAL), (TOPIC, "Name", LITERAL), False),
    ((TOPIC, "Name", PatternType.ANY), (TOPIC, "*", LITERAL), False),
    ((TOPIC, "Name", PatternType.MATCH), (TOPIC, "*", LITERAL), True),
    ((TOPIC, "Name", PREFIXED), (TOPIC, "Name", PREFIXED), True),
    ((TOPIC, "Name", PREFIXED), (TOPIC, "Name-something", PREFIXED), False),
    ((TOPIC, "Name-something", PREFIXED), (TOPIC, "Name", PREFIXED), False),
    ((TOPIC, "Name-something", PatternType.ANY), (TOPIC, "Name", PREFIXED), False),
    ((TOPIC, "Name-something", PatternType.MATCH), (TOPIC, "Name", PREFIXED), True),
])
def test_resource_pattern_filter(filt, pattern, expected):
    assert ResourcePatternFilter(*filt).matches(_p(*pattern)) is expected


def test_unknown_filters_and_codes():
    assert ResourcePatternFilter(ResourceType.UNKNOWN, None, LITERAL).is_unknown()
    assert ResourcePatternFilter(GROUP, None, PatternType.UNKNOWN).is_unknown()
    assert from_code(AclOperation, 99) is AclOperation.UNKNOWN and from_code(ResourceType, 2) is TOPIC
    records, results = Acls().decide_delete([AclBindingFilter(ResourcePatternFilter(ResourceType.UNKNOWN))])
    assert records == [] and results == [(ErrorCode.INVALID_REQUEST, "Unknown patternFilter.", [])]


def test_entry_filter_compares_text():
    b = binding(TOPIC, "t", LITERAL, "User:alice", "*", Op.READ, ALLOW)
    assert AclBindingFilter(entry=AccessControlEntryFilter("User:alice")).matches(b)
    assert not AclBindingFilter(entry=AccessControlEntryFilter("User:*")).matches(b)
    assert not AclBindingFilter(entry=AccessControlEntryFilter(host="1.2.3.4")).matches(b)
    assert AclBindingFilter(entry=AccessControlEntryFilter(operation=Op.READ, permission_type=ALLOW)).matches(b)
    assert not AclBindingFilter(entry=AccessControlEntryFilter(operation=Op.ALL)).matches(b)


# ------------------------------------------------------------------ the store

def test_create_validates_like_kafka():
    acls = Acls()
    ok = binding(TOPIC, "t", LITERAL, "User:a", "*", Op.READ, ALLOW)
    bad = [binding(ResourceType.ANY, "t", LITERAL, "User:a", "*", Op.READ, ALLOW),
           binding(TOPIC, "t", PatternType.MATCH, "User:a", "*", Op.READ, ALLOW),
           binding(TOPIC, "t", PatternType.ANY, "User:a", "*", Op.READ, ALLOW),
           binding(TOPIC, "t", LITERAL, "User:a", "*", Op.ANY, ALLOW),
           binding(TOPIC, "t", LITERAL, "User:a", "*", Op.READ, AclPermissionType.ANY),
           binding(TOPIC, "", LITERAL, "User:a", "*", Op.READ, ALLOW),
           binding(CLUSTER, "other", LITERAL, "User:a", "*", Op.ALTER, ALLOW),
           binding(TOPIC, "t", LITERAL, "alice", "*", Op.READ, ALLOW)]
    records, results = acls.decide_create([ok, *bad, ok], lambda: "x")
    assert len(records) == 1 and len(acls) == 0                    # deciding changes nothing
    assert results[0] == (ErrorCode.NONE, None) and results[-1] == (ErrorCode.NONE, None)
    assert all(code == ErrorCode.INVALID_REQUEST for code, _ in results[1:-1])
    assert results[7][1] == "The only valid name for the CLUSTER resource is kafka-cluster"
    acls.replay(records[0])
    assert acls.decide_create([ok], lambda: "y") == ([], [(ErrorCode.NONE, None)])   # exists: no record


def test_delete_reports_matches_and_a_filter_that_matches_nothing_succeeds():
    env = Env()
    a = binding(TOPIC, "t", LITERAL, "User:a", "*", Op.READ, ALLOW)
    b = binding(TOPIC, "t", PREFIXED, "User:b", "*", Op.WRITE, DENY)
    env.add(a, b)
    by_match = AclBindingFilter(ResourcePatternFilter(TOPIC, "tx", PatternType.MATCH))
    nothing = AclBindingFilter(ResourcePatternFilter(GROUP, "g", LITERAL))
    records, results = env.acls.decide_delete([by_match, nothing, ANY_FILTER])
    assert results[0] == (ErrorCode.NONE, None, [b]) and results[1] == (ErrorCode.NONE, None, [])
    assert sorted(map(str, results[2][2])) == sorted(map(str, [a, b]))
    assert len(records) == 2                                         # each ACL removed once
    for r in records:
        env.acls.replay(r)
    assert len(env.acls) == 0 and env.acls.bindings(ANY_FILTER) == []


def test_replay_refuses_bad_records_and_snapshots_round_trip():
    env = Env()
    env.add(binding(TOPIC, "t", LITERAL, "User:a", "*", Op.READ, ALLOW),
            binding(GROUP, "g", PREFIXED, "User:*", "10.0.0.1", Op.ALL, DENY))
    copy = Acls.from_snapshot(env.acls.to_snapshot())
    assert sorted(map(str, copy.bindings(ANY_FILTER))) == sorted(map(str, env.acls.bindings(ANY_FILTER)))
    with pytest.raises(ValueError):
        env.acls.replay({"type": "remove_acl", "id": "nope"})
    for bad in ({"type": "acl", "id": "z"},
                {"type": "acl", "id": "z", "resource_type": 2, "resource_name": "t", "pattern_type": 2,
                 "principal": "User:a", "host": "*", "operation": 3, "permission_type": 3},
                {"type": "other"}):
        with pytest.raises(ValueError):
            env.acls.replay(bad)
    assert len(env.acls) == 2


# ------------------------------------------------------------------ against a brute-force model

# a small universe, so that ALLOWs and DENYs, prefixes and wildcards collide often
NAMES = ["a", "ab", "b", "*"]
PRINCIPALS = ["User:alice", "User:*"]
HOSTS = ["*", "10.0.0.1"]
RTYPES = [TOPIC, GROUP]
OPS = [Op.ALL, Op.READ, Op.WRITE, Op.CREATE, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS]
ACTION_OPS = [op for op in OPS if op is not Op.ALL]
ACTION_USERS, ACTION_HOSTS = ["alice", "bob", "root"], ["10.0.0.1", "10.0.0.2"]
ACTION_NAMES = ["a", "ab", "abc", "b", "x"]
ALL_ACTIONS = list(itertools.product(ACTION_USERS, ACTION_HOSTS, ACTION_OPS, RTYPES, ACTION_NAMES))

bindings = st.builds(binding, st.sampled_from(RTYPES), st.sampled_from(NAMES), st.sampled_from([LITERAL, PREFIXED]),
                     st.sampled_from(PRINCIPALS), st.sampled_from(HOSTS), st.sampled_from(OPS),
                     st.sampled_from([ALLOW, DENY]))


def model(acls, super_users, allow_everyone, user, host, op, rtype, name):
    """The rules read literally, over every ACL."""
    if f"User:{user}" in super_users:
        return True

    def pattern_applies(p):
        return p.resource_type is rtype and (
            (p.pattern_type is LITERAL and p.name in (name, "*"))
            or (p.pattern_type is PREFIXED and name.startswith(p.name)))
    applicable = [b for b in acls if pattern_applies(b.pattern)]
    if not applicable:
        return allow_everyone
    mine = [b.entry for b in applicable if b.entry.principal in (f"User:{user}", "User:*")
            and b.entry.host in ("*", host)]
    if any(e.permission_type is DENY and e.operation in (op, Op.ALL) for e in mine):
        return False
    implied = {op}
    if op is Op.DESCRIBE:
        implied |= {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER}
    if op is Op.DESCRIBE_CONFIGS:
        implied |= {Op.ALTER_CONFIGS}
    return any(e.permission_type is ALLOW and (e.operation is Op.ALL or e.operation in implied) for e in mine)


class AuthorizerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.allow_everyone = False
        self.super_users = {"User:root"}
        self.env = Env(self.super_users)
        self.model_acls: set[AclBinding] = set()

    @rule(b=bindings)
    def add(self, b):
        self.env.add(b)
        self.model_acls.add(b)

    @rule(data=st.data())
    def delete_one(self, data):
        if self.model_acls:
            b = data.draw(st.sampled_from(sorted(self.model_acls, key=str)))
            self.env.remove(b)
            self.model_acls.discard(b)

    @rule(rtype=st.sampled_from(RTYPES + [ResourceType.ANY]), name=st.sampled_from(NAMES + [None]),
          ptype=st.sampled_from([LITERAL, PREFIXED, PatternType.ANY, PatternType.MATCH]),
          principal=st.sampled_from(PRINCIPALS + ["User:bob", None]), op=st.sampled_from(OPS + [Op.ANY]))
    def delete_by_filter(self, rtype, name, ptype, principal, op):
        f = AclBindingFilter(ResourcePatternFilter(rtype, name, ptype), AccessControlEntryFilter(principal, None, op))
        records, [(code, _, deleted)] = self.env.acls.decide_delete([f])
        assert code == ErrorCode.NONE
        assert set(deleted) == {b for b in self.model_acls if f.matches(b)}
        for r in records:
            self.env.acls.replay(r)
        self.model_acls -= set(deleted)

    @rule()
    def restart_from_snapshot(self):
        acls = Acls.from_snapshot(self.env.acls.to_snapshot())
        self.env.acls = acls
        self.env.authorizer = Authorizer(acls, self.super_users, self.allow_everyone)

    @rule()
    def toggle_allow_everyone(self):
        self.allow_everyone = not self.allow_everyone
        self.env.authorizer.allow_everyone_if_no_acl_found = self.allow_everyone

    @rule(rtype=st.sampled_from(RTYPES), name=st.sampled_from(ACTION_NAMES))
    def decide(self, rtype, name):
        for user, host, op in itertools.product(ACTION_USERS, ACTION_HOSTS, ACTION_OPS):
            expected = model(self.model_acls, self.super_users, self.allow_everyone, user, host, op, rtype, name)
            assert self.env.ok(user, op, rtype, name, host=host) is expected, (user, host, op, rtype, name)

    @invariant()
    def same_acls(self):
        assert set(self.env.acls.bindings(ANY_FILTER)) == self.model_acls
        assert len(self.env.acls) == len(self.model_acls)


AuthorizerMachine.TestCase.settings = settings(max_examples=examples(150), stateful_step_count=40, deadline=None)
TestAuthorizerAgainstModel = AuthorizerMachine.TestCase


@settings(max_examples=examples(400), deadline=None)
@given(acls=st.lists(bindings, max_size=12), allow_everyone=st.booleans())
def test_every_decision_matches_the_model(acls, allow_everyone):
    env = Env({"User:root"}, allow_everyone)
    env.add(*acls)
    for action in ALL_ACTIONS:
        user, host, op, rtype, name = action
        assert env.ok(user, op, rtype, name, host=host) is model(set(acls), {"User:root"}, allow_everyone,
                                                                 *action), (action, acls)
