"""The operator's commands over SASL_SSL with `--command-config`, a Kafka client properties file
written as for kafka-*.sh (security.protocol, sasl.mechanism, sasl.jaas.config, a PEM trust
store), against a broker with an authorizer: SCRAM users and ACLs managed with the CLI, then
used by the CLI; wrong credentials and missing rights each one line with their exit code."""
from __future__ import annotations

import pytest
from oncelog_cli import oncelog

from oncelog.testing.secure import SCRAM_USERS, SecureBroker

pytestmark = pytest.mark.processes

AUTHORIZER = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "super.users": "User:admin", "allow.everyone.if.no.acl.found": "false"}


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    b = SecureBroker(tmp_path_factory.mktemp("cli-secure"), AUTHORIZER).start()
    yield b
    b.stop()


def command_config(secure: SecureBroker, path, user: str, password: str, mechanism: str = "SCRAM-SHA-512"):
    path.write_text(f"""# as kafka-topics.sh --command-config takes it
security.protocol=SASL_SSL
sasl.mechanism={mechanism}
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
username="{user}" password="{password}";
ssl.truststore.location={secure.pki.ca}
ssl.truststore.type=PEM
""")
    return str(path)


def test_admin_manages_topics_users_and_acls_that_then_apply(secure, tmp_path):
    b = secure.address("SASL_SSL")
    admin = command_config(secure, tmp_path / "admin.properties", "admin", SCRAM_USERS["admin"])

    def as_admin(*args, **kw):
        return oncelog(*args, "--command-config", admin, bootstrap=b, **kw)

    assert as_admin("topic", "create", "orders", "-p", "2").code == 0
    assert {"name": "orders", "partitions": 2, "internal": False} in as_admin("topic", "list", "--format",
                                                                              "json").json()

    # a SCRAM user made from the CLI (password on stdin, never on the command line)
    r = as_admin("user", "create", "carol", "--mechanism", "SCRAM-SHA-512", stdin="carol-secret\n")
    assert r.code == 0, r.err
    users = {u["user"]: u["mechanisms"] for u in as_admin("user", "list", "--format", "json").json()}
    assert users["carol"] == [{"mechanism": "SCRAM-SHA-512", "iterations": 4096}]
    assert {"mechanism": "SCRAM-SHA-256", "iterations": 4096} in users["alice"]   # bootstrapped by the broker
    carol = command_config(secure, tmp_path / "carol.properties", "carol", "carol-secret")

    # carol may do nothing yet
    denied = oncelog("consume", "orders", "-e", "--command-config", carol, bootstrap=b)
    assert denied.code == 1 and "TOPIC_AUTHORIZATION_FAILED" in denied.one_line_error()

    # ACLs from the CLI, listed field by field
    for op in ("write", "read", "describe"):
        r = as_admin("acl", "create", "--allow-principal", "User:carol", "--operation", op, "--topic", "orders")
        assert r.code == 0, r.err
    listed = as_admin("acl", "list", "--principal", "carol", "--format", "json").json()
    assert sorted(listed, key=lambda a: a["operation"]) == [
        {"resource_type": "TOPIC", "resource_name": "orders", "pattern_type": "LITERAL", "principal": "User:carol",
         "host": "*", "operation": op, "permission": "ALLOW"} for op in ("DESCRIBE", "READ", "WRITE")]

    r = oncelog("produce", "orders", "-p", "1", "--command-config", carol, stdin="hello\n", bootstrap=b)
    assert r.code == 0, r.err
    out = oncelog("consume", "orders", "-e", "--format", "json", "--command-config", carol, bootstrap=b)
    assert [(x["partition"], x["offset"], x["value"]) for x in out.json_lines()] == [(1, 0, "hello")]

    # deleted ACLs no longer apply; a deleted user no longer logs in
    deleted = as_admin("acl", "delete", "--principal", "User:carol", "--operation", "write", "--format", "json").json()
    assert [(a["principal"], a["operation"]) for a in deleted] == [("User:carol", "WRITE")]
    refused = oncelog("produce", "orders", "--command-config", carol, stdin="again\n", bootstrap=b)
    # without WRITE on any topic, not even a producer id (Kafka's KIP-679 rule)
    assert refused.code == 1 and "CLUSTER_AUTHORIZATION_FAILED" in refused.one_line_error()
    assert as_admin("user", "delete", "carol").code == 0
    assert "carol" not in {u["user"] for u in as_admin("user", "list", "--format", "json").json()}
    gone = oncelog("topic", "list", "--command-config", carol, bootstrap=b)
    assert gone.code == 4 and gone.one_line_error().startswith(f"oncelog: authentication with {b} failed")


def test_wrong_password_and_plaintext_to_a_tls_listener(secure, tmp_path):
    b = secure.address("SASL_SSL")
    wrong = command_config(secure, tmp_path / "wrong.properties", "admin", "not-the-password")
    r = oncelog("topic", "list", "--command-config", wrong, bootstrap=b)
    assert r.code == 4 and "authentication" in r.one_line_error()
    no_tls = tmp_path / "plain.properties"
    no_tls.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
                      'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required '
                      'username="alice" password="alice-secret";\n'
                      "ssl.truststore.location=/nonexistent/ca.pem\n")
    r = oncelog("topic", "list", "--command-config", str(no_tls), bootstrap=b)
    assert r.code == 2 and "ssl.truststore.location=/nonexistent/ca.pem" in r.one_line_error()
    jks = tmp_path / "store.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed binary keystore")
    (tmp_path / "jks.properties").write_text(f"security.protocol=SSL\nssl.truststore.location={jks}\n")
    r = oncelog("topic", "list", "--command-config", str(tmp_path / "jks.properties"), bootstrap=b)
    assert r.code == 2 and "PEM" in r.one_line_error()


def test_plain_mechanism_with_librdkafka_names_works_too(secure, tmp_path):
    """A file in librdkafka's names (what confluent-kafka users already have) works as it is."""
    b = secure.address("SASL_SSL")
    f = tmp_path / "rdkafka.properties"
    f.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=alice\n"
                 f"sasl.password=alice-secret\nssl.ca.location={secure.pki.ca}\n")
    r = oncelog("cluster", "info", "--format", "json", "--command-config", str(f), bootstrap=b)
    assert r.json()["brokers"][0]["port"] == secure.port("SASL_SSL")
