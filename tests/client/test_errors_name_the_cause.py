"""Errors that name their cause, against a real broker with TLS, SASL and an authorizer (issue 39):
a principal without ACLs is told it is not authorized (CLUSTER_AUTHORIZATION_FAILED,
TRANSACTIONAL_ID_AUTHORIZATION_FAILED), not that "the broker does not support idempotent
producing"; a plaintext client on a TLS listener is told the server may expect TLS (librdkafka's
hint), not "connection lost: closed"."""
from __future__ import annotations

import pytest
from tests.cli.oncelog_cli import oncelog

from oncelog.client import AdminClient, Producer
from oncelog.client.aio.connection import BrokerConnectionError
from oncelog.client.errors import AuthorizationError, KafkaClientError
from oncelog.protocol.errors import ErrorCode
from oncelog.testing.secure import SecureBroker

pytestmark = pytest.mark.processes

AUTHORIZER = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "allow.everyone.if.no.acl.found": "false", "super.users": "User:alice"}


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    b = SecureBroker(tmp_path_factory.mktemp("errors-cause"), AUTHORIZER).start()
    yield b
    b.stop()


def bob(secure) -> dict:
    """A PLAIN user without a single ACL."""
    return {"bootstrap.servers": secure.address("SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": "bob", "sasl.password": "bob-secret"}


def test_an_idempotent_producer_without_acls_is_told_it_is_not_authorized(secure):
    with pytest.raises(AuthorizationError) as refused:
        Producer({**bob(secure), "enable.idempotence": "required"})
    text = str(refused.value)
    assert refused.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert "not authorized" in text and "CLUSTER_AUTHORIZATION_FAILED" in text
    assert "does not support" not in text


def test_a_transactional_producer_without_acls_names_the_transactional_id_refusal(secure):
    with Producer({**bob(secure), "transactional.id": "bobs-txn"}) as p:
        with pytest.raises(KafkaClientError) as refused:
            p.init_transactions(30)
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in str(refused.value)
    assert "does not support" not in str(refused.value)


def test_oncelog_produce_without_acls_says_not_authorized(secure, tmp_path):
    props = tmp_path / "bob.properties"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config="
                     "org.apache.kafka.common.security.plain.PlainLoginModule required "
                     'username="bob" password="bob-secret";\n')
    props.chmod(0o600)
    r = oncelog("produce", "t", "--command-config", str(props), bootstrap=secure.address("SASL_PLAINTEXT"),
                stdin="a\n")
    line = r.one_line_error()
    assert "not authorized" in line and "CLUSTER_AUTHORIZATION_FAILED" in line, line
    assert "does not support" not in line


@pytest.mark.parametrize("listener", ["SSL", "SASL_SSL"])
def test_a_plaintext_client_on_a_tls_listener_is_told_to_check_security_protocol(secure, listener):
    with pytest.raises(BrokerConnectionError) as lost:
        AdminClient({"bootstrap.servers": secure.address(listener), "request.timeout.ms": 10000})
    assert "the server may expect TLS: check security.protocol (it is PLAINTEXT)" in str(lost.value)


def test_a_tls_client_on_a_plaintext_listener_is_told_the_server_may_not_expect_tls(secure):
    with pytest.raises(BrokerConnectionError) as lost:
        AdminClient({"bootstrap.servers": secure.address("PLAINTEXT"), "security.protocol": "SSL",
                     "ssl.ca.location": str(secure.pki.ca), "request.timeout.ms": 10000})
    assert "the server may not expect TLS: check security.protocol (it is SSL)" in str(lost.value)


def test_oncelog_on_a_tls_listener_without_tls_gives_the_hint(secure):
    r = oncelog("topic", "list", bootstrap=secure.address("SSL"))
    line = r.one_line_error()
    assert "check security.protocol" in line, line
