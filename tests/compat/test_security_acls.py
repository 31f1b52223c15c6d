"""Authenticated principals meet the authorizer: confluent-kafka, kafka-python, aiokafka and
kafkajs log in as alice over SASL_SSL with SCRAM-SHA-512 (or with alice's certificate over mutual
TLS) to a broker that allows nothing without an ACL, and each is refused exactly where alice's
ACLs say, with Kafka's error as that client reports it, while the broker's audit log names the
principal it refused.

`admin` (a super user, SCRAM) grants over SASL_SSL with confluent-kafka's AdminClient. Each ACL is
there so that every case differs from its allowed twin by one rule:

    alice           TOPIC ro      DESCRIBE, READ     producing to ro: Produce refuses (no WRITE)
    alice           TOPIC rw      WRITE, READ        producing to rw works; consuming it needs
    alice           GROUP allowed- (prefixed) READ     READ on the group: `described` has DESCRIBE
    alice           GROUP described DESCRIBE           only (JoinGroup refuses), `denied` nothing
                                                     (FindCoordinator refuses: DESCRIBE)
    alice           TRANSACTIONAL_ID alice-tx WRITE  likewise: `described-tx` DESCRIBE only
    alice           TRANSACTIONAL_ID described-tx DESCRIBE   (InitProducerId refuses), `other-tx`
                                                     nothing (FindCoordinator refuses)
    User:CN=alice   TOPIC mtls    WRITE              the certificate's principal (default mapping)
    User:*          TOPIC shared  WRITE              anyone may write shared...
    bob             TOPIC shared  WRITE (DENY)       ...except bob: DENY beats the ALLOW
"""
from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from test_kafkajs import kafkajs, run_node  # noqa: F401 - the fixture, installed once per session
from test_security_clients import aiokafka_conf, confluent_conf, kafka_python_conf, kafkajs_args

from oncelog.testing.secure import REAUTH_MS, SCRAM_USERS, SecureBroker

pytestmark = pytest.mark.processes

ALICE = "User:alice"
CERT_ALICE = "User:CN=alice"      # SecureBroker's client certificate is /CN=alice; no mapping rules
SCRAM = "SCRAM-SHA-512"
CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka", "kafkajs"]
TOPICS = ("ro", "rw", "shared", "mtls")
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY


def acl(principal, rtype, name, op, permission=ALLOW, pattern=ResourcePatternType.LITERAL):
    return AclBinding(rtype, name, pattern, principal, "*", op, permission)


ACLS = [
    acl(ALICE, ResourceType.TOPIC, "ro", AclOperation.DESCRIBE),
    acl(ALICE, ResourceType.TOPIC, "ro", AclOperation.READ),
    acl(ALICE, ResourceType.TOPIC, "rw", AclOperation.WRITE),
    acl(ALICE, ResourceType.TOPIC, "rw", AclOperation.READ),
    acl(ALICE, ResourceType.GROUP, "allowed-", AclOperation.READ, pattern=ResourcePatternType.PREFIXED),
    acl(ALICE, ResourceType.GROUP, "described", AclOperation.DESCRIBE),
    acl(ALICE, ResourceType.TRANSACTIONAL_ID, "alice-tx", AclOperation.WRITE),
    acl(ALICE, ResourceType.TRANSACTIONAL_ID, "described-tx", AclOperation.DESCRIBE),
    acl(CERT_ALICE, ResourceType.TOPIC, "mtls", AclOperation.WRITE),
    acl("User:*", ResourceType.TOPIC, "shared", AclOperation.WRITE),
    acl("User:bob", ResourceType.TOPIC, "shared", AclOperation.WRITE, DENY),
]


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    b = SecureBroker(tmp_path_factory.mktemp("secure-acls"), {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "allow.everyone.if.no.acl.found": "false",
    }).start()
    try:
        admin = AdminClient(confluent_conf(b, SCRAM, SCRAM_USERS["admin"], user="admin"))
        for f in admin.create_topics([NewTopic(t, 1, 1) for t in TOPICS]).values():
            f.result(30)
        for f in admin.create_acls(ACLS).values():
            f.result(30)
        # a record in rw for the consumers to read
        p = Producer(confluent_conf(b, SCRAM, SCRAM_USERS["admin"], user="admin"))
        p.produce("rw", b"from admin")
        assert p.flush(30) == 0
        yield b
    finally:
        b.stop()


# Kafka's error as each client reports it: librdkafka's and kafkajs's error names, the Python
# clients' exception classes
TOPIC_DENIED = {"confluent-kafka": "TOPIC_AUTHORIZATION_FAILED", "kafka-python": "TopicAuthorizationFailedError",
                "aiokafka": "TopicAuthorizationFailedError", "kafkajs": "TOPIC_AUTHORIZATION_FAILED"}
GROUP_DENIED = {"confluent-kafka": "GROUP_AUTHORIZATION_FAILED", "kafka-python": "GroupAuthorizationFailedError",
                "aiokafka": "GroupAuthorizationFailedError", "kafkajs": "GROUP_AUTHORIZATION_FAILED"}
TXN_DENIED = {"confluent-kafka": "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
              "kafka-python": "TransactionalIdAuthorizationFailedError",
              "aiokafka": "TransactionalIdAuthorizationFailed", "kafkajs": "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"}
# kafkajs drops a refused FindCoordinator's error (BrokerPool.withBroker catches it) and reports
# that no coordinator was found, for groups and transactional ids alike, against Kafka as here
COORDINATOR_DENIED = {"kafkajs": "KafkaJSGroupCoordinatorNotFound"}


# ------------------------------------------------------------------ each client's three actions
# Each returns None when the action succeeded, else the name of what the client raised/reported.

def _confluent_error(e: KafkaException) -> str:
    return e.args[0].name()


def confluent_produce(secure, way, topic, user="alice", password="alice-secret"):
    p = Producer({**confluent_conf(secure, way, password, user), "message.timeout.ms": 15000})
    outcome = []
    p.produce(topic, b"confluent-kafka", on_delivery=lambda err, _msg: outcome.append(err))
    p.flush(30)
    assert outcome, "no delivery report"
    return None if outcome[0] is None else outcome[0].name()


def confluent_consume(secure, way, topic, group):
    c = Consumer({**confluent_conf(secure, way), "group.id": group, "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None:
                return None if m.error() is None else m.error().name()
        raise AssertionError("no record and no error within 30 s")
    finally:
        c.close()


def confluent_transact(secure, way, topic, txn_id):
    p = Producer({**confluent_conf(secure, way), "transactional.id": txn_id})
    try:
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, b"confluent-kafka in a transaction")
        p.commit_transaction(30)
    except KafkaException as e:
        return _confluent_error(e)
    return None


def kafka_python_produce(secure, way, topic):
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KPError
    p = KafkaProducer(**kafka_python_conf(secure, way), max_block_ms=15000)
    try:
        p.send(topic, b"kafka-python").get(30)
    except KPError as e:
        return type(e).__name__
    finally:
        p.close()
    return None


def kafka_python_consume(secure, way, topic, group):
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError as KPError
    c = KafkaConsumer(topic, **kafka_python_conf(secure, way), group_id=group, auto_offset_reset="earliest")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if c.poll(200):
                return None
    except KPError as e:
        return type(e).__name__
    finally:
        c.close()
    raise AssertionError("no record and no error within 30 s")


def kafka_python_transact(secure, way, topic, txn_id):
    from kafka import KafkaProducer
    from kafka.errors import KafkaError as KPError
    p = KafkaProducer(**kafka_python_conf(secure, way), transactional_id=txn_id, max_block_ms=15000)
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"kafka-python in a transaction")
        p.commit_transaction()
    except KPError as e:
        return type(e).__name__
    finally:
        p.close(timeout=5)
    return None


def _aiokafka(coro_fn):
    from aiokafka.errors import KafkaError as AKError
    try:
        asyncio.run(asyncio.wait_for(coro_fn(), 60))
    except AKError as e:
        return type(e).__name__
    return None


def aiokafka_produce(secure, way, topic):
    from aiokafka import AIOKafkaProducer

    async def run():
        p = AIOKafkaProducer(**aiokafka_conf(secure, way), request_timeout_ms=15000)
        await p.start()
        try:
            await p.send_and_wait(topic, b"aiokafka")
        finally:
            await p.stop()
    return _aiokafka(run)


def aiokafka_consume(secure, way, topic, group):
    from aiokafka import AIOKafkaConsumer

    async def run():
        c = AIOKafkaConsumer(topic, **aiokafka_conf(secure, way), group_id=group, auto_offset_reset="earliest")
        await c.start()
        try:
            await asyncio.wait_for(c.getone(), 30)
        finally:
            await c.stop()
    return _aiokafka(run)


def aiokafka_transact(secure, way, topic, txn_id):
    from aiokafka import AIOKafkaProducer

    async def run():
        p = AIOKafkaProducer(**aiokafka_conf(secure, way), transactional_id=txn_id)
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait(topic, b"aiokafka in a transaction")
        finally:
            await p.stop()
    return _aiokafka(run)


def kafkajs_action(node_path, secure, way, action, topic, name="-"):
    out = run_node(node_path, "kafkajs_acls.js", action, topic, name, *kafkajs_args(secure, way), timeout_s=120)
    return None if out["ok"] else out["type"]


@pytest.fixture(params=CLIENTS)
def client(request, secure):
    """(produce(topic), consume(topic, group), transact(topic, transactional id)) of one client
    logged in as alice with SCRAM-SHA-512 (`way` picks another login for produce)."""
    name = request.param
    if name == "kafkajs":
        node_path = request.getfixturevalue("kafkajs")
        return name, (lambda topic, way=SCRAM: kafkajs_action(node_path, secure, way, "produce", topic),
                      lambda topic, group: kafkajs_action(node_path, secure, SCRAM, "consume", topic, group),
                      lambda topic, tid: kafkajs_action(node_path, secure, SCRAM, "transact", topic, tid))
    produce, consume, transact = {
        "confluent-kafka": (confluent_produce, confluent_consume, confluent_transact),
        "kafka-python": (kafka_python_produce, kafka_python_consume, kafka_python_transact),
        "aiokafka": (aiokafka_produce, aiokafka_consume, aiokafka_transact),
    }[name]
    return name, (lambda topic, way=SCRAM: produce(secure, way, topic),
                  lambda topic, group: consume(secure, SCRAM, topic, group),
                  lambda topic, tid: transact(secure, SCRAM, topic, tid))


def audit_logged(secure, principal, operation, resource, since=0):
    """Waits for the broker's audit line refusing `principal` `operation` on `resource`."""
    pattern = re.compile(rf"Principal = {re.escape(principal)} is Denied operation = {operation} "
                         rf"from host = 127\.0\.0\.1 on resource = {re.escape(resource)}\b")
    deadline = time.monotonic() + 10
    while not pattern.search(secure.log_text()[since:]):
        assert time.monotonic() < deadline, f"no audit line: {principal} denied {operation} on {resource}"
        time.sleep(0.05)


# ------------------------------------------------------------------ the cases
def test_write_on_the_topic(secure, client):
    name, (produce, _consume, _transact) = client
    before = len(secure.log_text())
    assert produce("ro") == TOPIC_DENIED[name]
    audit_logged(secure, ALICE, "WRITE", "TOPIC:ro", before)
    assert produce("rw") is None


def test_read_on_the_group(secure, client):
    name, (_produce, consume, _transact) = client
    before = len(secure.log_text())
    assert consume("rw", "described") == GROUP_DENIED[name]
    audit_logged(secure, ALICE, "READ", "GROUP:described", before)      # JoinGroup
    assert consume("rw", f"allowed-{name}") is None


def test_describe_on_the_group(secure, client):
    name, (_produce, consume, _transact) = client
    before = len(secure.log_text())
    assert consume("rw", "denied") == COORDINATOR_DENIED.get(name, GROUP_DENIED[name])
    audit_logged(secure, ALICE, "DESCRIBE", "GROUP:denied", before)     # FindCoordinator


def test_write_on_the_transactional_id(secure, client):
    name, (_produce, _consume, transact) = client
    before = len(secure.log_text())
    assert transact("rw", "described-tx") == TXN_DENIED[name]
    audit_logged(secure, ALICE, "WRITE", "TRANSACTIONAL_ID:described-tx", before)   # InitProducerId
    assert transact("rw", "alice-tx") is None


def test_describe_on_the_transactional_id(secure, client):
    name, (_produce, _consume, transact) = client
    before = len(secure.log_text())
    assert transact("rw", "other-tx") == COORDINATOR_DENIED.get(name, TXN_DENIED[name])
    audit_logged(secure, ALICE, "DESCRIBE", "TRANSACTIONAL_ID:other-tx", before)    # FindCoordinator


def test_mutual_tls_principal_is_the_certificates_name(secure, client):
    """The certificate's principal is User:CN=alice (no mapping rules), not User:alice: alice's
    WRITE on rw does not let it write there, its own ACL on mtls does."""
    name, (produce, _consume, _transact) = client
    before = len(secure.log_text())
    assert produce("rw", way="mTLS") == TOPIC_DENIED[name]
    audit_logged(secure, CERT_ALICE, "DESCRIBE", "TOPIC:rw", before)
    assert produce("mtls", way="mTLS") is None


def test_a_deny_for_the_user_beats_an_allow_for_everyone(secure):
    before = len(secure.log_text())
    assert confluent_produce(secure, "PLAIN", "shared", "bob", "bob-secret") == "TOPIC_AUTHORIZATION_FAILED"
    audit_logged(secure, "User:bob", "WRITE", "TOPIC:shared", before)
    assert confluent_produce(secure, "PLAIN", "shared") is None        # alice, by the User:* ALLOW alone


def test_pipelined_produce_requests_are_each_authorized_as_alice(secure):
    """Small batches and five requests in flight: Produce requests are handled while earlier ones
    wait for their fsync (the broker's pipelined path), each as the connection's principal."""
    conf = {**confluent_conf(secure, SCRAM), "linger.ms": 0, "batch.num.messages": 5,
            "max.in.flight.requests.per.connection": 5, "message.timeout.ms": 15000}
    for topic, expected in (("rw", None), ("ro", "TOPIC_AUTHORIZATION_FAILED")):
        p = Producer(conf)
        outcomes: list = []
        for i in range(500):
            p.produce(topic, str(i).encode(), on_delivery=lambda err, _msg, seen=outcomes: seen.append(err))
            p.poll(0)
        p.flush(30)
        assert len(outcomes) == 500
        assert {None if e is None else e.name() for e in outcomes} == {expected}


def test_admin_is_a_super_user_without_acls(secure):
    assert confluent_produce(secure, SCRAM, "ro", "admin", SCRAM_USERS["admin"]) is None


def test_the_principal_survives_re_authentication(secure):
    """On a listener whose sessions expire (KIP-368) librdkafka re-authenticates on the open
    connection; the requests after it are still alice's (rw is writable by alice alone)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    logger = logging.getLogger("test_security_acls.librdkafka")
    logger.addHandler(Collect())
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    conf = {**confluent_conf(secure, SCRAM), "bootstrap.servers": secure.address("REAUTH"),
            "security.protocol": "SASL_PLAINTEXT", "debug": "security", "message.timeout.ms": 15000}
    p = Producer(conf, logger=logger)
    outcomes: list = []
    deliver = lambda err, _msg: outcomes.append(err)  # noqa: E731
    p.produce("rw", b"before", on_delivery=deliver)
    assert p.flush(30) == 0 and outcomes == [None]
    # keep the connection busy until librdkafka has re-authenticated twice (expiry is REAUTH_MS)
    deadline = time.monotonic() + 10 * REAUTH_MS / 1000
    while sum("Auth in state REAUTH" in line for line in lines) < 2:
        assert time.monotonic() < deadline, [line for line in lines if "auth" in line.lower()][-10:]
        p.produce("rw", b"during", on_delivery=deliver)
        p.flush(30)
    p.produce("rw", b"after", on_delivery=deliver)
    assert p.flush(30) == 0
    assert outcomes and all(err is None for err in outcomes), outcomes
