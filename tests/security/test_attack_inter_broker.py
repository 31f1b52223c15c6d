"""Issue 25, finding 3: the broker-to-broker requests were open to anyone the authorizer let
through. docs/security.md told PLAINTEXT clusters with an authorizer to grant User:ANONYMOUS
CLUSTER_ACTION so that peers (which did not authenticate) could send WriteTxnMarkers; with that
grant, or without an authorizer at all, any client could write an ABORT marker for another
producer's open transaction: that producer's commit_transaction then returned OK and its records
never became visible to read_committed readers (a committed transaction silently lost).

Now a broker-only request (WriteTxnMarkers, AddPartitionsToTxn v4) is served only to another
broker of the cluster, authenticated with the cluster credential, on whatever listener, and no
name, certificate, stored credential or ACL stands in for it. Written as the attack: raw requests
where a client library would not send them."""
from __future__ import annotations

import ssl
import time
import uuid

import pytest
from cluster_attacks import client, open_transaction, verify_only, write_marker
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage import cluster_credential
from oncelog.testing.broker_login import as_broker
from oncelog.testing.secure import PLAIN_USERS, SCRAM_USERS, SecureBroker, jaas
from oncelog.testing.tls import make_client

pytestmark = pytest.mark.processes

DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
CLUSTER_USER = cluster_credential.DEFAULT_USER
TOPIC = "payments"


def scram_admin(b: SecureBroker) -> dict:
    return {"bootstrap.servers": b.address("SASL_SSL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(b.pki.ca), "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin",
            "sasl.password": SCRAM_USERS["admin"]}


def read_committed(bootstrap: str, topic: str, until: int) -> list[bytes]:
    """Values read_committed from partition 0 until the position passes `until` (the end offset)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": str(uuid.uuid4()), "isolation.level": "read_committed",
                  "enable.partition.eof": True, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})   # (no group ACL here: a commit at close would retry for 45 s)
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is None:
                got.append(m.value())
            elif c.position([TopicPartition(topic, 0)])[0].offset >= until:
                return got
        raise AssertionError(f"read_committed never reached offset {until}; read {got}")
    finally:
        c.close()


@pytest.fixture
def remedied(tmp_path):
    """A broker with an authorizer where, as the old docs advised, User:ANONYMOUS holds
    CLUSTER_ACTION (and may use every topic and transactional id, as its producers need)."""
    b = SecureBroker(tmp_path, {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                                "super.users": "User:admin"}).start()
    grants = [(ResourceType.BROKER, "kafka-cluster", AclOperation.CLUSTER_ACTION),
              (ResourceType.TOPIC, "*", AclOperation.ALL), (ResourceType.TRANSACTIONAL_ID, "*", AclOperation.ALL)]
    admin = AdminClient(scram_admin(b))
    for f in admin.create_acls([AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*", op,
                                           AclPermissionType.ALLOW) for rtype, name, op in grants]).values():
        f.result(30)
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    yield b
    b.stop()


async def test_an_unauthenticated_client_cannot_abort_another_producers_transaction(remedied):
    plaintext = remedied.address("PLAINTEXT")
    victim = Producer({"bootstrap.servers": plaintext, "transactional.id": "victim", "linger.ms": 0})
    victim.init_transactions(30)
    victim.begin_transaction()
    for i in range(3):
        victim.produce(TOPIC, b"paid-%d" % i, partition=0)
    assert victim.flush(30) == 0

    attacker = client(plaintext)       # PLAINTEXT: User:ANONYMOUS, no login
    try:
        pid, epoch, coordinator_epoch = await open_transaction(attacker, TOPIC, 0)
        assert await write_marker(attacker, TOPIC, 0, pid, epoch, coordinator_epoch, commit=False) == DENIED
        assert await verify_only(attacker, "victim", pid, epoch, TOPIC, 0) == DENIED
    finally:
        attacker.close()

    victim.commit_transaction(30)
    # the commit's own marker follows the prepared commit: the records become visible, all of them
    assert read_committed(plaintext, TOPIC, until=4) == [b"paid-0", b"paid-1", b"paid-2"]
    assert "Principal = User:ANONYMOUS is Denied operation = CLUSTER_ACTION" in remedied.log_text()


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """No authorizer (everything else allowed); a certificate named after the cluster user, mapped
    to that name; a PLAIN user of that name in the JAAS value."""
    d = tmp_path_factory.mktemp("impostors")
    b = SecureBroker(d, {
        "listener.name.ssl.ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas({**PLAIN_USERS, CLUSTER_USER: "guessed"}),
    })
    make_client(b.pki, CLUSTER_USER)
    b.start()
    # an admin stores a SCRAM credential under the cluster user's name, with a password it knows
    admin = AdminClient(scram_admin(b))
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    for f in admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            CLUSTER_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"chosen")]).values():
        f.result(30)
    yield b
    b.stop()


def tls(b: SecureBroker, cert: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(b.pki.ca))
    if cert is not None:
        crt, key = b.pki.client(cert)
        ctx.load_cert_chain(str(crt), str(key))
    return ctx


async def refused(c) -> bool:
    """Every broker-only request of `c` is refused with CLUSTER_AUTHORIZATION_FAILED."""
    try:
        return (await write_marker(c, TOPIC, 0, 1, 0) == DENIED
                and await verify_only(c, "someone", 1, 0, TOPIC, 0) == DENIED)
    finally:
        c.close()


async def test_broker_only_requests_refuse_every_principal_but_the_brokers(secure):
    b = secure
    # no authorizer: anyone else may do anything, but not this
    assert await refused(client(b.address("PLAINTEXT")))
    assert await refused(client(b.address("SASL_PLAINTEXT"), "alice", PLAIN_USERS["alice"]))
    assert await refused(client(b.address("SASL_SSL"), "admin", SCRAM_USERS["admin"], "SCRAM-SHA-512", tls(b)))
    # mutual TLS with a certificate whose mapped name is the cluster user's: User:oncelog-broker, not a broker
    assert await refused(client(b.address("SSL"), tls=tls(b, CLUSTER_USER)))
    assert f"Principal = User:{CLUSTER_USER} is Denied operation = CLUSTER_ACTION" in b.log_text()
    # the broker principal itself, on every listener (where there is no SASL, as the cluster login)
    for listener, mechanism in (("PLAINTEXT", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "PLAIN"),
                                ("SASL_SSL", "SCRAM-SHA-256"), ("SSL", "SCRAM-SHA-512")):
        c = as_broker(b.address(listener), b.process.data_dir, mechanism,
                      tls(b, "alice") if listener == "SSL" else tls(b) if listener == "SASL_SSL" else None)
        try:
            assert await write_marker(c, TOPIC, 0, 1, 0) == ErrorCode.NONE, listener  # no such producer: nothing to end
        finally:
            c.close()


@pytest.mark.parametrize("listener,mechanism,user,password", [
    ("SASL_PLAINTEXT", "SCRAM-SHA-512", CLUSTER_USER, "chosen"),     # the stored credential is not consulted
    ("SASL_PLAINTEXT", "PLAIN", CLUSTER_USER, "guessed"),           # nor the JAAS entry
    ("PLAINTEXT", "SCRAM-SHA-512", CLUSTER_USER, "guessed"),         # the cluster login, wrong password
    ("PLAINTEXT", "SCRAM-SHA-512", "admin", SCRAM_USERS["admin"]),   # the cluster login is the brokers' alone
])
async def test_the_cluster_users_name_needs_the_cluster_credential(secure, listener, mechanism, user, password):
    c = client(secure.address(listener), user, password, mechanism)
    try:
        with pytest.raises(KafkaProtocolError) as e:   # refused at login
            await write_marker(c, TOPIC, 0, 1, 0)
        assert e.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED, e.value
    finally:
        c.close()


async def test_plaintext_clients_asking_for_sasl_meet_only_the_cluster_login(secure):
    """A client that speaks SASL to a listener without it is offered the cluster mechanism alone,
    and refused any other (Kafka answers ILLEGAL_SASL_STATE there)."""
    c = client(secure.address("PLAINTEXT"), "alice", PLAIN_USERS["alice"], "PLAIN")
    try:
        with pytest.raises(KafkaProtocolError) as e:
            await write_marker(c, TOPIC, 0, 1, 0)
        assert e.value.code == ErrorCode.UNSUPPORTED_SASL_MECHANISM, e.value
    finally:
        c.close()
