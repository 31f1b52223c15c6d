"""confluent-kafka (librdkafka), kafka-python, aiokafka and kafkajs connect to oncelog as they
connect to Kafka: over SASL_SSL with SCRAM-SHA-512 and with PLAIN, and over mutual TLS, each
producing a record and reading it back; each is refused with a wrong password (and the broker
logs the user and address). The key material is made with openssl in the test's directory."""
from __future__ import annotations

import asyncio
import re
import time

import pytest
from test_kafkajs import kafkajs, run_node  # noqa: F401 - the fixture, installed once per session

from oncelog.testing.secure import SecureBroker

pytestmark = pytest.mark.processes

WAYS = ["SCRAM-SHA-512", "PLAIN", "mTLS"]
USER, PASSWORD = "alice", "alice-secret"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    b = SecureBroker(tmp_path_factory.mktemp("secure-compat")).start()
    yield b
    b.stop()


REFUSAL = r"authentication failed: user={user} mechanism={mechanism} from 127\.0\.0\.1:\d+ on SASL_SSL"


@pytest.fixture
def refusal_logged(secure):
    """Checks, after the test body, that the broker logged a new refusal naming user and address."""
    seen: list[tuple[str, str]] = []
    before = len(secure.log_text())
    yield lambda user, mechanism: seen.append((user, mechanism))
    for user, mechanism in seen:
        pattern = REFUSAL.format(user=user, mechanism=mechanism)
        deadline = time.monotonic() + 10
        while not re.search(pattern, secure.log_text()[before:]):
            assert time.monotonic() < deadline, f"no refusal logged for {user} ({mechanism})"
            time.sleep(0.05)


def topic_for(request):
    return re.sub(r"[^a-zA-Z0-9]", "-", request.node.name)[-100:]


# ------------------------------------------------------------------ confluent-kafka

def confluent_conf(secure, way, password=PASSWORD, user=USER):
    if way == "mTLS":
        return {"bootstrap.servers": secure.address("SSL"), "security.protocol": "SSL",
                "ssl.ca.location": str(secure.pki.ca), "ssl.certificate.location": str(secure.client_cert),
                "ssl.key.location": str(secure.client_key)}
    return {"bootstrap.servers": secure.address("SASL_SSL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secure.pki.ca), "sasl.mechanism": way, "sasl.username": user,
            "sasl.password": password}


@pytest.mark.parametrize("way", WAYS)
def test_confluent_kafka(secure, way, request):
    from confluent_kafka import Consumer, Producer
    topic = topic_for(request)
    p = Producer(confluent_conf(secure, way))
    results = []
    p.produce(topic, b"confluent-" + way.encode(), on_delivery=lambda err, msg: results.append(err))
    assert p.flush(30) == 0 and results == [None]
    c = Consumer({**confluent_conf(secure, way), "group.id": f"{topic}-g", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    deadline, got = time.monotonic() + 30, None
    while got is None and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got = m.value()
    c.close()
    assert got == b"confluent-" + way.encode()


@pytest.mark.parametrize("way", ["SCRAM-SHA-512", "PLAIN"])
def test_confluent_kafka_wrong_password_is_refused(secure, way, refusal_logged):
    from confluent_kafka import KafkaError, Producer
    errors = []
    p = Producer({**confluent_conf(secure, way, "wrong"), "error_cb": errors.append})
    deadline = time.monotonic() + 15
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        p.poll(0.2)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    refusal_logged(USER, way)


# ------------------------------------------------------------------ kafka-python

def kafka_python_conf(secure, way, password=PASSWORD, user=USER):
    if way == "mTLS":
        return dict(bootstrap_servers=secure.address("SSL"), security_protocol="SSL", ssl_cafile=str(secure.pki.ca),
                    ssl_certfile=str(secure.client_cert), ssl_keyfile=str(secure.client_key))
    return dict(bootstrap_servers=secure.address("SASL_SSL"), security_protocol="SASL_SSL",
                ssl_cafile=str(secure.pki.ca), sasl_mechanism=way, sasl_plain_username=user,
                sasl_plain_password=password)


@pytest.mark.parametrize("way", WAYS)
def test_kafka_python(secure, way, request):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    topic = topic_for(request)
    p = KafkaProducer(**kafka_python_conf(secure, way))
    p.send(topic, b"kafka-python-" + way.encode()).get(timeout=30)
    p.close()
    c = KafkaConsumer(**kafka_python_conf(secure, way), consumer_timeout_ms=20000, auto_offset_reset="earliest")
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    first = next(iter(c), None)   # (iterating to the end would wait out consumer_timeout_ms)
    c.close()
    assert first is not None and first.value == b"kafka-python-" + way.encode()


@pytest.mark.parametrize("way", ["SCRAM-SHA-512", "PLAIN"])
def test_kafka_python_wrong_password_is_refused(secure, way, refusal_logged):
    from kafka import KafkaProducer
    from kafka.errors import KafkaError
    with pytest.raises(KafkaError):
        # kafka-python retries a refused bootstrap until bootstrap_timeout_ms (30 s by default)
        p = KafkaProducer(**kafka_python_conf(secure, way, "wrong"), max_block_ms=3000, bootstrap_timeout_ms=3000)
        p.send("never", b"x").get(timeout=3)
    refusal_logged(USER, way)


# ------------------------------------------------------------------ aiokafka

def aiokafka_conf(secure, way, password=PASSWORD, user=USER):
    from aiokafka.helpers import create_ssl_context
    if way == "mTLS":
        return dict(bootstrap_servers=secure.address("SSL"), security_protocol="SSL",
                    ssl_context=create_ssl_context(cafile=str(secure.pki.ca), certfile=str(secure.client_cert),
                                                   keyfile=str(secure.client_key)))
    return dict(bootstrap_servers=secure.address("SASL_SSL"), security_protocol="SASL_SSL",
                ssl_context=create_ssl_context(cafile=str(secure.pki.ca)), sasl_mechanism=way,
                sasl_plain_username=user, sasl_plain_password=password)


@pytest.mark.parametrize("way", WAYS)
def test_aiokafka(secure, way, request):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    topic = topic_for(request)

    async def run():
        p = AIOKafkaProducer(**aiokafka_conf(secure, way))
        await p.start()
        try:
            await p.send_and_wait(topic, b"aiokafka-" + way.encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(**aiokafka_conf(secure, way), auto_offset_reset="earliest")
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            await c.seek_to_beginning(tp)
            return (await asyncio.wait_for(c.getone(), 30)).value
        finally:
            await c.stop()
    assert asyncio.run(run()) == b"aiokafka-" + way.encode()


@pytest.mark.parametrize("way", ["SCRAM-SHA-512", "PLAIN"])
def test_aiokafka_wrong_password_is_refused(secure, way, refusal_logged):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    async def run():
        p = AIOKafkaProducer(**aiokafka_conf(secure, way, "wrong"))
        try:
            await p.start()
        finally:
            await p.stop()
    with pytest.raises(KafkaError):
        asyncio.run(run())
    refusal_logged(USER, way)


# ------------------------------------------------------------------ kafkajs

def kafkajs_args(secure, way, password=PASSWORD, user=USER):
    if way == "mTLS":
        return [secure.address("SSL"), str(secure.pki.ca), "mtls", str(secure.client_cert), str(secure.client_key)]
    return [secure.address("SASL_SSL"), str(secure.pki.ca), "sasl", way.lower(), user, password]


@pytest.mark.parametrize("way", WAYS)
def test_kafkajs(kafkajs, secure, way, request):  # noqa: F811 - the fixture
    address, ca, mode, *rest = kafkajs_args(secure, way)
    out = run_node(kafkajs, "kafkajs_secure.js", address, topic_for(request), ca, mode, *rest, timeout_s=120)
    assert out.get("produced") is True, out
    assert out["values"] == [f"kafkajs-{mode}"]


@pytest.mark.parametrize("way", ["SCRAM-SHA-512", "PLAIN"])
def test_kafkajs_wrong_password_is_refused(kafkajs, secure, way, request, refusal_logged):  # noqa: F811 - the fixture
    address, ca, _mode, *rest = kafkajs_args(secure, way, "wrong")
    out = run_node(kafkajs, "kafkajs_secure.js", address, topic_for(request), ca, "refused", *rest, timeout_s=120)
    assert out["produced"] is False and "SASL" in out["error"] and "Authentication failed" in out["error"], out
    refusal_logged(USER, way)
