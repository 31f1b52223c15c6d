"""oncelog's own client over TLS and SASL (librdkafka's config names), against a real broker:
produce and read back over SASL_SSL with SCRAM-SHA-512 and PLAIN and over mutual TLS; a wrong
password fails with AuthenticationError, not a retry loop."""
from __future__ import annotations

import pytest

from oncelog.client import Consumer, Producer
from oncelog.client.aio.connection import AuthenticationError
from oncelog.client.types import TopicPartition
from oncelog.testing.secure import SecureBroker

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    b = SecureBroker(tmp_path_factory.mktemp("client-secure")).start()
    yield b
    b.stop()


def conf(secure, way, password="alice-secret"):
    if way == "mTLS":
        return {"bootstrap.servers": secure.address("SSL"), "security.protocol": "SSL",
                "ssl.ca.location": str(secure.pki.ca), "ssl.certificate.location": str(secure.client_cert),
                "ssl.key.location": str(secure.client_key)}
    return {"bootstrap.servers": secure.address("SASL_SSL"), "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(secure.pki.ca), "sasl.mechanism": way, "sasl.username": "alice",
            "sasl.password": password}


@pytest.mark.parametrize("way", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "mTLS"])
def test_produce_and_consume(secure, way):
    topic = f"client-{way.lower()}"
    with Producer(conf(secure, way)) as p:
        p.send(topic, b"oncelog-" + way.encode(), partition=0).result(30)
    with Consumer({**conf(secure, way), "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, 0)])
        records = c.poll(10)
    assert [r.value for r in records] == [b"oncelog-" + way.encode()]


def test_wrong_password_is_an_authentication_error(secure):
    with pytest.raises(AuthenticationError, match="invalid credentials"):
        with Consumer(conf(secure, "SCRAM-SHA-512", "wrong")) as c:
            c.assign([TopicPartition("never", 0)])
            c.poll(5)
