"""The authorizer against a real `oncelog serve`, driven by real clients as User:ANONYMOUS over
PLAINTEXT (the principal of every connection until SASL/TLS are wired), modelled on Kafka's
AuthorizerIntegrationTest: one test per rule (DENY wins, prefixed patterns, implied DESCRIBE,
super users, allow.everyone.if.no.acl.found) and per family of APIs (topics, groups, transactional
ids), with Kafka's error codes as the clients report them.

The main broker is bootstrapped the way an operator would without SASL: started with
allow.everyone.if.no.acl.found=true, ANONYMOUS is granted ALL on the cluster (so it may manage
ACLs and create topics), then the broker is killed (-9) and restarted with the default false:
from then on every topic and group needs an ACL, and the ACL made before the kill must have
survived it (the metadata log is fsynced before CreateAcls is answered).
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from test_transactions import call  # one raw-request helper for the compat tests

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

AUTHORIZER = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer"}
ME = "User:ANONYMOUS"
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ANY_ACL = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                           AclPermissionType.ANY)


# ------------------------------------------------------------------ helpers


def acl(rtype, name, op, permission=ALLOW, pattern=LITERAL, principal=ME):
    return AclBinding(rtype, name, pattern, principal, "*", op, permission)


def grant(admin: AdminClient, *bindings: AclBinding) -> None:
    for f in admin.create_acls(list(bindings)).values():
        f.result(20)


def new_topic(admin: AdminClient, name: str | None = None) -> str:
    name = name or f"authz-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(20)
    return name


def produce_error(bootstrap: str, topic: str) -> KafkaError | None:
    """Produce one record with librdkafka; the delivery error, or None."""
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 10000})
    outcome = []
    p.produce(topic, b"v", on_delivery=lambda err, _msg: outcome.append(err))
    p.flush(20)
    assert outcome, "no delivery report"
    return outcome[0]


def assert_denied(err: KafkaError | None, code: int = KafkaError.TOPIC_AUTHORIZATION_FAILED) -> None:
    assert err is not None and err.code() == code, err


# ------------------------------------------------------------------ the brokers
@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A broker with an authorizer where ANONYMOUS may do anything on the cluster resource only."""
    b = BrokerProcess(tmp_path_factory.mktemp("authz") / "data",
                      {**AUTHORIZER, "allow.everyone.if.no.acl.found": "true",
                       "transaction.two.phase.commit.enable": "true"}).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        grant(admin, acl(ResourceType.BROKER, "kafka-cluster", AclOperation.ALL))
        b.overrides["allow.everyone.if.no.acl.found"] = "false"
        b.restart(clean=False)
        yield b
    finally:
        b.stop()


@pytest.fixture
def admin(secured):
    return AdminClient({"bootstrap.servers": secured.bootstrap})


# ------------------------------------------------------------------ the rules
def test_acls_survive_a_kill_and_restart(admin):
    bindings = admin.describe_acls(ANY_ACL).result(20)
    assert acl(ResourceType.BROKER, "kafka-cluster", AclOperation.ALL) in bindings


def test_write_needs_an_acl_and_a_grant_lets_it_through(secured, admin):
    topic = new_topic(admin)
    assert_denied(produce_error(secured.bootstrap, topic))          # refused by Metadata (no DESCRIBE)
    grant(admin, acl(ResourceType.TOPIC, topic, AclOperation.DESCRIBE))
    assert_denied(produce_error(secured.bootstrap, topic))          # refused by Produce (no WRITE)
    grant(admin, acl(ResourceType.TOPIC, topic, AclOperation.WRITE))
    assert produce_error(secured.bootstrap, topic) is None


def test_deny_wins_over_allow(secured, admin):
    topic = new_topic(admin)
    grant(admin, acl(ResourceType.TOPIC, topic, AclOperation.ALL, principal="User:*"),
          acl(ResourceType.TOPIC, topic, AclOperation.WRITE),
          acl(ResourceType.TOPIC, topic, AclOperation.WRITE, DENY))
    assert_denied(produce_error(secured.bootstrap, topic))


def test_prefixed_pattern_covers_names_with_the_prefix_only(secured, admin):
    prefix = f"pfx-{uuid.uuid4().hex[:6]}-"
    grant(admin, acl(ResourceType.TOPIC, prefix, AclOperation.WRITE, pattern=PREFIXED))
    inside, outside = new_topic(admin, prefix + "a"), new_topic(admin, f"other-{uuid.uuid4().hex[:6]}")
    grant(admin, acl(ResourceType.TOPIC, outside, AclOperation.DESCRIBE))   # so Produce itself is what refuses
    assert produce_error(secured.bootstrap, inside) is None
    assert_denied(produce_error(secured.bootstrap, outside))


def test_read_implies_describe_and_hidden_topics_stay_hidden(secured, admin):
    readable, hidden = new_topic(admin), new_topic(admin)
    grant(admin, acl(ResourceType.TOPIC, readable, AclOperation.READ))
    listed = admin.list_topics(timeout=20).topics
    assert readable in listed and hidden not in listed
    [ok] = admin.describe_topics(TopicCollection([readable])).values()
    assert ok.result(20).name == readable
    [denied] = admin.describe_topics(TopicCollection([hidden])).values()
    with pytest.raises(KafkaException) as e:
        denied.result(20)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # a named topic the caller may not describe: 29 without an existence check (Kafka's rule)
    r = call(secured.bootstrap, ApiKey.METADATA, 12, topics=(
        entities.make(entities.nested(ApiKey.METADATA, 12, "request", "MetadataRequestTopic"),
                      topic_id=None, name=f"never-created-{uuid.uuid4().hex[:6]}"),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    assert r.topics[0].error_code.value == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_authorized_operations_are_the_callers(secured, admin):
    topic = new_topic(admin)
    grant(admin, acl(ResourceType.TOPIC, topic, AclOperation.READ),
          acl(ResourceType.TOPIC, topic, AclOperation.ALTER_CONFIGS))
    [f] = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True).values()
    assert set(f.result(20).authorized_operations) == {
        AclOperation.READ, AclOperation.DESCRIBE, AclOperation.ALTER_CONFIGS, AclOperation.DESCRIBE_CONFIGS}
    cluster = admin.describe_cluster(include_authorized_operations=True).result(20)
    assert AclOperation.ALTER in set(cluster.authorized_operations)


def test_group_needs_read_on_the_group(secured, admin):
    topic = new_topic(admin)
    group = f"g-{uuid.uuid4().hex[:8]}"
    grant(admin, acl(ResourceType.TOPIC, topic, AclOperation.READ))
    c = Consumer({"bootstrap.servers": secured.bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        error = None
        for _ in range(100):
            m = c.poll(0.2)
            if m is not None and m.error() is not None:
                error = m.error()
                break
        assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error
    finally:
        c.close()


def test_kafka_python_gets_kafkas_exceptions(secured, admin):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    topic = new_topic(admin)
    p = KafkaProducer(bootstrap_servers=secured.bootstrap, max_block_ms=10000)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            p.send(topic, b"v").get(20)
    finally:
        p.close()
    grant(admin, acl(ResourceType.TOPIC, topic, AclOperation.READ))
    c = KafkaConsumer(topic, bootstrap_servers=secured.bootstrap, group_id=f"g-{uuid.uuid4().hex[:8]}",
                      consumer_timeout_ms=10000)
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            for _ in range(50):
                c.poll(200)
    finally:
        c.close()


def test_transactional_producer_needs_write_on_its_transactional_id(secured, admin):
    topic = new_topic(admin)
    tid = f"tx-{uuid.uuid4().hex[:8]}"
    grant(admin, acl(ResourceType.TOPIC, topic, AclOperation.WRITE))
    # refused by FindCoordinator (no DESCRIBE), then by InitProducerId itself (DESCRIBE, no WRITE)
    for granted in (AclOperation.DESCRIBE, AclOperation.WRITE):
        p = Producer({"bootstrap.servers": secured.bootstrap, "transactional.id": tid})
        with pytest.raises(KafkaException) as e:
            p.init_transactions(20)
        assert e.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        grant(admin, acl(ResourceType.TRANSACTIONAL_ID, tid, granted))
    p = Producer({"bootstrap.servers": secured.bootstrap, "transactional.id": tid})
    p.init_transactions(20)
    p.begin_transaction()
    p.produce(topic, b"in a transaction")
    p.commit_transaction(20)


def test_enable_2pc_needs_two_phase_commit_and_write_on_the_transactional_id(secured, admin):
    """KIP-939: InitProducerId v6 with Enable2Pc needs TWO_PHASE_COMMIT (15) beside WRITE on the
    transactional id; neither implies the other, ALL implies both (Kafka's AclOperation and its
    KafkaApis check; confluent-kafka's enum lacks 15, so the ACLs are made with raw CreateAcls)."""
    prefix = f"tx2pc-{uuid.uuid4().hex[:6]}"
    write_id, two_pc_id, both_id, all_id = (f"{prefix}-{k}" for k in ("write", "2pc", "both", "all"))
    creation = entities.nested(ApiKey.CREATE_ACLS, 3, "request", "AclCreation")
    grants = [(write_id, AclOperation.WRITE.value), (two_pc_id, 15), (both_id, AclOperation.WRITE.value),
              (both_id, 15), (all_id, AclOperation.ALL.value)]
    r = call(secured.bootstrap, ApiKey.CREATE_ACLS, 3, creations=tuple(
        creation(resource_type=ResourceType.TRANSACTIONAL_ID.value, resource_name=name, resource_pattern_type=3,
                 principal=ME, host="*", operation=op, permission_type=3) for name, op in grants))
    assert [x.error_code.value for x in r.results] == [0] * len(grants)
    # DescribeAcls shows the new operation back
    described = call(secured.bootstrap, ApiKey.DESCRIBE_ACLS, 3, resource_type_filter=5, resource_name_filter=two_pc_id,
                     pattern_type_filter=3, principal_filter=None, host_filter=None, operation=1, permission_type=1)
    assert [a.operation for r_ in described.resources for a in r_.acls] == [15]

    def init(tid: str, enable_2pc: bool) -> int:
        deadline = time.monotonic() + 30
        while True:  # the first one may create __transaction_state: COORDINATOR_LOAD_IN_PROGRESS meanwhile
            code = call(secured.bootstrap, ApiKey.INIT_PRODUCER_ID, 6, transactional_id=tid, transaction_timeout=60000,
                        producer_id=-1, producer_epoch=-1, enable2_pc=enable_2pc).error_code.value
            if code != KafkaError.COORDINATOR_LOAD_IN_PROGRESS or time.monotonic() > deadline:
                return code
            time.sleep(0.05)

    assert init(write_id, False) == 0
    assert init(write_id, True) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert init(two_pc_id, True) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert init(both_id, True) == 0
    assert init(all_id, True) == 0


# ------------------------------------------------------------------ the ACL APIs, bad input
def test_filter_matching_nothing_is_empty_not_an_error(secured, admin):
    nothing = AclBindingFilter(ResourceType.TOPIC, f"no-such-{uuid.uuid4().hex}", ResourcePatternType.MATCH,
                               None, None, AclOperation.ANY, AclPermissionType.ANY)
    assert admin.describe_acls(nothing).result(20) == []
    [f] = admin.delete_acls([nothing]).values()
    assert f.result(20) == []


def test_bad_acl_bindings_and_filters_are_refused_as_kafka_refuses_them(secured, admin):
    creation = entities.nested(ApiKey.CREATE_ACLS, 3, "request", "AclCreation")
    # ANY where a binding needs a value: INVALID_REQUEST for that binding, with Kafka's message
    r = call(secured.bootstrap, ApiKey.CREATE_ACLS, 3, creations=(
        creation(resource_type=1, resource_name="t", resource_pattern_type=3, principal=ME, host="*",
                 operation=4, permission_type=3),
        creation(resource_type=2, resource_name="", resource_pattern_type=3, principal=ME, host="*",
                 operation=4, permission_type=3)))
    assert [(x.error_code.value, x.error_message) for x in r.results] == [
        (KafkaError.INVALID_REQUEST, "Invalid resourceType ANY"),
        (KafkaError.INVALID_REQUEST, "Resource name should not be empty")]
    # a code Kafka's enums do not have: the request does not parse (Kafka's validate), the
    # connection is closed with a log line, and the broker goes on serving
    with pytest.raises(Exception):  # noqa: B017 - whatever the client raises for a closed connection
        call(secured.bootstrap, ApiKey.CREATE_ACLS, 3, creations=(
            creation(resource_type=99, resource_name="t", resource_pattern_type=3, principal=ME, host="*",
                     operation=4, permission_type=3),))
    with pytest.raises(Exception):  # noqa: B017
        call(secured.bootstrap, ApiKey.DESCRIBE_ACLS, 3, resource_type_filter=99, resource_name_filter=None,
             pattern_type_filter=1, principal_filter=None, host_filter=None, operation=1, permission_type=1)
    log = Path(secured.log_file).read_text()
    assert "malformed create_acls v3 request" in log and "malformed describe_acls v3 request" in log
    assert not [b for b in admin.describe_acls(ANY_ACL).result(20) if b.name == "t"]


# ------------------------------------------------------------------ brokers of their own
def test_super_users_may_do_everything(tmp_path):
    with BrokerProcess(tmp_path / "data", {**AUTHORIZER, "super.users": f"User:admin;{ME}"}) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        topic = new_topic(admin)
        grant(admin, acl(ResourceType.TOPIC, topic, AclOperation.ALL, DENY))
        assert produce_error(b.bootstrap, topic) is None


def test_allow_everyone_if_no_acl_found_only_for_resources_without_acls(tmp_path):
    with BrokerProcess(tmp_path / "data", {**AUTHORIZER, "allow.everyone.if.no.acl.found": "true"}) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        open_topic, guarded = new_topic(admin), new_topic(admin)
        grant(admin, acl(ResourceType.TOPIC, guarded, AclOperation.READ, principal="User:alice"))
        assert produce_error(b.bootstrap, open_topic) is None
        assert_denied(produce_error(b.bootstrap, guarded))


def test_acl_apis_without_an_authorizer_are_security_disabled(shared_broker):
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    [f] = admin.create_acls([acl(ResourceType.TOPIC, "t", AclOperation.READ)]).values()
    with pytest.raises(KafkaException) as e:
        f.result(20)
    assert e.value.args[0].code() == KafkaError.SECURITY_DISABLED
    r = call(shared_broker.bootstrap, ApiKey.DESCRIBE_ACLS, 3, resource_type_filter=1, resource_name_filter=None,
             pattern_type_filter=1, principal_filter=None, host_filter=None, operation=1, permission_type=1)
    assert r.error_code.value == KafkaError.SECURITY_DISABLED
