"""Listeners, TLS and SASL over real sockets against a real broker (Kafka's SaslAuthenticatorTest
cases, byte for byte where the client libraries would hide them): each listener's protocol, v0 and
v1 SASL framing, PLAIN and SCRAM, the refusals Kafka gives with a log line naming the user and
address, re-authentication (KIP-368), TLS refusals, and the credential APIs."""
from __future__ import annotations

import base64
import os
import re
import secrets
import signal
import ssl
import struct
import time

import pytest

from oncelog.core.security.plain import client_token
from oncelog.core.security.scram import ScramClient, ScramMechanism
from oncelog.protocol import entities
from oncelog.protocol import metadata as md
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.testing.raw_client import RawConnection
from oncelog.testing.secure import REAUTH_MS, SecureBroker
from oncelog.testing.tls import make_ca, make_client

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    b = SecureBroker(tmp_path_factory.mktemp("secure")).start()
    yield b
    b.stop()


# ------------------------------------------------------------------ the raw client, as these tests use it

class Conn(RawConnection):
    """`testing.raw_client.RawConnection` with what these tests ask of a connection."""

    def raw_token(self, token: bytes) -> bytes:
        """A SASL v0 token, framed by its size only; the answer frame."""
        self.send_frame(token)
        return self.recv_frame()

    def metadata(self) -> md.MetadataResponse:
        corr = self.send(ApiKey.METADATA, 12, md.encode_request(12, None))
        frame = self.recv_frame()
        assert struct.unpack(">i", frame[:4])[0] == corr
        return md.decode_response(12, frame, 5)

    def closed(self) -> bool:
        """Closed by the broker without a byte of answer."""
        return self.closed_within(5, quietly=True)


def client_tls(secure: SecureBroker, cert=None, key=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(secure.pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def plain_login(c: Conn, user: str, password: str, version: int = 2):
    hs = c.call(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN")
    assert int(hs.error_code) == 0
    return c.call(ApiKey.SASL_AUTHENTICATE, version, auth_bytes=client_token(user, password))


def scram_login(c: Conn, mechanism: ScramMechanism, user: str, password: str, forge_nonce=None):
    hs = c.call(ApiKey.SASL_HANDSHAKE, 1, mechanism=mechanism.mechanism_name)
    assert int(hs.error_code) == 0
    client = ScramClient(mechanism, user, password, secrets.token_bytes)
    first = c.call(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=client.first_message())
    assert int(first.error_code) == 0, first.error_message
    final = client.final_message(bytes(first.auth_bytes))
    if forge_nonce is not None:
        final = forge_nonce(final)
    last = c.call(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=final)
    if int(last.error_code) == 0:
        client.verify_server_final(bytes(last.auth_bytes))
    return last


def wait_for_log(secure: SecureBroker, pattern: str, timeout_s: float = 10) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = re.search(pattern, secure.log_text())
        if m:
            return m.group(0)
        time.sleep(0.05)
    raise AssertionError(f"no log line matching {pattern!r}; tail:\n{secure.log_text()[-2000:]}")


# ------------------------------------------------------------------ listeners

def test_every_listener_is_bound_and_metadata_answers_the_listener_the_client_came_in_on(secure):
    for name, tls in (("PLAINTEXT", None), ("SASL_PLAINTEXT", None), ("SASL_SSL", client_tls(secure))):
        c = Conn(secure.address(name), tls)
        if name != "PLAINTEXT":
            assert int(plain_login(c, "alice", "alice-secret").error_code) == 0
        m = c.metadata()
        assert [(b.host, b.port) for b in m.brokers.values()] == [("127.0.0.1", secure.port(name))], name
        c.close()


def test_sasl_listener_refuses_a_request_before_authentication_and_logs_it(secure):
    c = Conn(secure.address("SASL_PLAINTEXT"))
    c.send(ApiKey.METADATA, 12, md.encode_request(12, None))
    assert c.closed()
    wait_for_log(secure, r"closing connection from 127\.0\.0\.1:\d+ on SASL_PLAINTEXT .*METADATA")


def test_api_versions_before_the_handshake_lists_the_sasl_apis(secure):
    c = Conn(secure.address("SASL_PLAINTEXT"))
    r = c.call(ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    versions = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in r.api_keys}
    assert versions[ApiKey.SASL_HANDSHAKE] == (0, 1) and versions[ApiKey.SASL_AUTHENTICATE] == (0, 2)
    assert int(plain_login(c, "bob", "bob-secret").error_code) == 0


# ------------------------------------------------------------------ PLAIN

def test_plain_v1_framing_authenticates_and_serves_requests(secure):
    c = Conn(secure.address("SASL_PLAINTEXT"))
    r = plain_login(c, "alice", "alice-secret")
    assert int(r.error_code) == 0 and bytes(r.auth_bytes) == b""
    assert c.metadata().brokers
    # a second handshake after authentication: ILLEGAL_SASL_STATE, the connection stays
    assert int(c.call(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code) == ErrorCode.ILLEGAL_SASL_STATE
    assert c.metadata().brokers


def test_plain_wrong_password_is_refused_then_closed_with_a_log_line(secure):
    c = Conn(secure.address("SASL_PLAINTEXT"))
    r = plain_login(c, "alice", "not-her-password")
    assert int(r.error_code) == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert r.error_message == "Authentication failed: Invalid username or password"
    assert c.closed()
    line = wait_for_log(secure, r"authentication failed: user=alice mechanism=PLAIN from 127\.0\.0\.1:\d+ "
                                r"on SASL_PLAINTEXT: wrong password")
    assert "not-her-password" not in secure.log_text(), line


def test_plain_v0_framing_as_kafka_python_2_0_speaks_it(secure):
    c = Conn(secure.address("SASL_PLAINTEXT"))
    hs = c.call(ApiKey.SASL_HANDSHAKE, 0, mechanism="PLAIN")
    assert int(hs.error_code) == 0 and list(hs.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    assert c.raw_token(client_token("bob", "bob-secret")) == b""   # the four zero bytes
    assert c.metadata().brokers


def test_plain_v0_framing_wrong_password_closes_without_an_answer(secure):
    c = Conn(secure.address("SASL_PLAINTEXT"))
    assert int(c.call(ApiKey.SASL_HANDSHAKE, 0, mechanism="PLAIN").error_code) == 0
    token = client_token("bob", "not-bobs")
    c.send_raw(struct.pack(">i", len(token)) + token)
    assert c.closed()   # no answer at all in v0 framing
    wait_for_log(secure, r"authentication failed: user=bob mechanism=PLAIN from 127\.0\.0\.1:\d+")


def test_unknown_mechanism_gets_unsupported_sasl_mechanism_with_the_enabled_list(secure):
    c = Conn(secure.address("SASL_PLAINTEXT"))
    hs = c.call(ApiKey.SASL_HANDSHAKE, 1, mechanism="GSSAPI")
    assert int(hs.error_code) == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert list(hs.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    assert c.closed()
    wait_for_log(secure, r"from 127\.0\.0\.1:\d+ on SASL_PLAINTEXT .*unsupported SASL mechanism 'GSSAPI'")


def test_another_request_during_the_exchange_gets_illegal_sasl_state_then_close(secure):
    c = Conn(secure.address("SASL_PLAINTEXT"))
    assert int(c.call(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code) == 0
    r = c.call(ApiKey.DESCRIBE_CLUSTER, 0, include_cluster_authorized_operations=False)
    assert int(r.error_code) == ErrorCode.ILLEGAL_SASL_STATE
    assert c.closed()


def test_oversized_frame_before_authentication_closes(secure):
    c = Conn(secure.address("SASL_PLAINTEXT"))
    c.send_raw(struct.pack(">i", 524288 + 1) + b"x" * 16)
    assert c.closed()
    wait_for_log(secure, r"sasl\.server\.max\.receive\.size")


# ------------------------------------------------------------------ SCRAM

@pytest.mark.parametrize("mechanism", list(ScramMechanism))
def test_scram_bootstrapped_by_add_scram_authenticates(secure, mechanism):
    c = Conn(secure.address("SASL_SSL"), client_tls(secure))
    r = scram_login(c, mechanism, "admin", "admin-secret")
    assert int(r.error_code) == 0, r.error_message
    assert c.metadata().brokers


def test_scram_wrong_password_and_unknown_user_get_the_same_answer(secure):
    answers = []
    for user, password in (("alice", "wrong"), ("nobody", "alice-secret")):
        c = Conn(secure.address("SASL_PLAINTEXT"))
        r = scram_login(c, ScramMechanism.SCRAM_SHA_256, user, password)
        answers.append((int(r.error_code), r.error_message))
        assert c.closed()
    assert answers[0] == answers[1] == (ErrorCode.SASL_AUTHENTICATION_FAILED, "Authentication failed during "
                                        "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256")
    wait_for_log(secure, r"authentication failed: user=nobody mechanism=SCRAM-SHA-256 from 127\.0\.0\.1:\d+")


def test_scram_client_final_with_a_wrong_nonce_is_refused(secure):
    def shorten(final: bytes) -> bytes:   # the client nonce alone: what Kafka < 3.7.2 let through as a suffix
        without, _, proof = final.decode().rpartition(",p=")
        c, r = without.split(",r=")
        return f"{c},r={r[:-4]},p={proof}".encode()
    c = Conn(secure.address("SASL_PLAINTEXT"))
    r = scram_login(c, ScramMechanism.SCRAM_SHA_512, "alice", "alice-secret", forge_nonce=shorten)
    assert int(r.error_code) == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert c.closed()
    wait_for_log(secure, r"user=alice mechanism=SCRAM-SHA-512 from 127\.0\.0\.1:\d+ on SASL_PLAINTEXT: "
                         r"Invalid client nonce")


def test_alter_and_describe_user_scram_credentials_then_log_in(secure):
    c = Conn(secure.address("SASL_SSL"), client_tls(secure))
    assert int(scram_login(c, ScramMechanism.SCRAM_SHA_512, "admin", "admin-secret").error_code) == 0
    from oncelog.core.security.scram import salted_password
    salt = os.urandom(16)
    up = entities.nested(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, "request", "ScramCredentialUpsertion")
    r = c.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, deletions=(), upsertions=(
        entities.make(up, name="carol", mechanism=2, iterations=8192, salt=salt,
                      salted_password=salted_password(ScramMechanism.SCRAM_SHA_512, "carol-secret", salt, 8192)),
        entities.make(up, name="dave", mechanism=2, iterations=100, salt=salt, salted_password=b"x")))
    by_user = {str(x.user): (int(x.error_code), x.error_message) for x in r.results}
    assert by_user["carol"] == (0, None)
    assert by_user["dave"][0] == ErrorCode.UNACCEPTABLE_CREDENTIAL
    name = entities.nested(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, "request", "UserName")
    d = c.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, users=(entities.make(name, name="carol"),
                                                                 entities.make(name, name="dave")))
    described = {str(x.user): (int(x.error_code), x.error_message, [(int(i.mechanism), int(i.iterations))
                                                                    for i in x.credential_infos]) for x in d.results}
    assert described["carol"] == (0, None, [(2, 8192)])   # no key material reaches a client
    assert described["dave"][0] == ErrorCode.RESOURCE_NOT_FOUND
    c2 = Conn(secure.address("SASL_PLAINTEXT"))
    assert int(scram_login(c2, ScramMechanism.SCRAM_SHA_512, "carol", "carol-secret").error_code) == 0
    # deleted: refused at the next login
    de = entities.nested(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, "request", "ScramCredentialDeletion")
    r = c.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, upsertions=(),
               deletions=(entities.make(de, name="carol", mechanism=2),))
    assert [int(x.error_code) for x in r.results] == [0]
    c3 = Conn(secure.address("SASL_PLAINTEXT"))
    assert int(scram_login(c3, ScramMechanism.SCRAM_SHA_512, "carol", "carol-secret").error_code) == \
        ErrorCode.SASL_AUTHENTICATION_FAILED


# ------------------------------------------------------------------ re-authentication (KIP-368)

def test_session_lifetime_is_announced_and_an_expired_session_is_closed(secure):
    c = Conn(secure.address("REAUTH"))
    r = plain_login(c, "alice", "alice-secret", version=1)
    assert entities.millis(r.session_lifetime) == REAUTH_MS
    assert c.metadata().brokers
    deadline = time.monotonic() + REAUTH_MS / 1000 + 0.5   # past the session, by the broker's clock too
    while time.monotonic() < deadline:
        time.sleep(0.1)
    c.send(ApiKey.METADATA, 12, md.encode_request(12, None))
    assert c.closed()
    wait_for_log(secure, r"closing connection of User:alice from 127\.0\.0\.1:\d+ on REAUTH: the authenticated "
                         r"session expired")


def test_reauthentication_keeps_the_connection(secure):
    c = Conn(secure.address("REAUTH"))
    assert int(plain_login(c, "bob", "bob-secret", version=1).error_code) == 0
    deadline = time.monotonic() + 1.1   # re-authentication is allowed once a second
    while time.monotonic() < deadline:
        time.sleep(0.1)
    r = plain_login(c, "bob", "bob-secret", version=1)
    assert int(r.error_code) == 0 and entities.millis(r.session_lifetime) == REAUTH_MS
    assert c.metadata().brokers


# ------------------------------------------------------------------ TLS

def test_plaintext_client_on_a_tls_port_is_closed_with_a_log_line(secure):
    c = Conn(secure.address("SASL_SSL"))
    c.send(ApiKey.API_VERSIONS, 0, b"")
    assert c.closed()
    wait_for_log(secure, r"TLS handshake failed from 127\.0\.0\.1:\d+ on SASL_SSL")
    good = Conn(secure.address("SASL_SSL"), client_tls(secure))
    assert int(plain_login(good, "alice", "alice-secret").error_code) == 0


def test_mutual_tls_needs_a_certificate_the_truststore_accepts(secure):
    ok = Conn(secure.address("SSL"), client_tls(secure, secure.client_cert, secure.client_key))
    assert ok.metadata().brokers
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        c = Conn(secure.address("SSL"), client_tls(secure))   # no certificate
        c.metadata()
    make_ca(secure.pki.directory, "rogue")
    cert, key = make_client(secure.pki, "mallory", ca="rogue")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        c = Conn(secure.address("SSL"), client_tls(secure, cert, key))
        c.metadata()
    wait_for_log(secure, r"TLS handshake failed from 127\.0\.0\.1:\d+ on SSL: .*(CERTIFICATE|certificate)")
    assert ok.metadata().brokers   # the broker and the good connection are unaffected


def test_tls_1_1_is_refused(secure):
    ctx = client_tls(secure)
    ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    except ssl.SSLError:
        pass
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        Conn(secure.address("SASL_SSL"), ctx).metadata()


def test_sighup_reloads_the_key_material_for_new_connections(tmp_path):
    b = SecureBroker(tmp_path)
    b.start()
    try:
        old = Conn(b.address("SASL_SSL"), client_tls(b))
        assert int(plain_login(old, "alice", "alice-secret").error_code) == 0
        before = old.sock.getpeercert()["subject"]
        # a new broker certificate with another name, signed by the same CA
        from oncelog.testing.tls import _sign
        _sign(b.pki.directory, "broker2", "/CN=localhost/O=reloaded", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1")
        pem = (b.pki.directory / "broker2.key").read_text() + (b.pki.directory / "broker2.crt").read_text()
        b.pki.broker_pem().write_text(pem)
        b.process.proc.send_signal(signal.SIGHUP)
        wait_for_log(b, r"listener SASL_SSL: TLS key material reloaded")
        new = Conn(b.address("SASL_SSL"), client_tls(b))
        assert ((("organizationName", "reloaded"),) in new.sock.getpeercert()["subject"]) and before != \
            new.sock.getpeercert()["subject"]
        assert old.metadata().brokers     # the open connection kept its session
        # a key file that does not load: the old material stays
        b.pki.broker_pem().write_text("not a key")
        b.process.proc.send_signal(signal.SIGHUP)
        wait_for_log(b, r"listener SASL_SSL: TLS key material did not reload")
        assert Conn(b.address("SASL_SSL"), client_tls(b)).sock.getpeercert()
    finally:
        b.stop()


def test_proof_bytes_are_base64(secure):
    # a client-final whose proof is not base64 is a malformed message: 58, closed, broker up
    c = Conn(secure.address("SASL_PLAINTEXT"))
    scram_login(c, ScramMechanism.SCRAM_SHA_256, "alice", "alice-secret",
                forge_nonce=lambda f: f.rpartition(b",p=")[0] + b",p=" + base64.b64encode(b"!")[:-1] + b"?")
    assert c.closed()


def test_describe_configs_never_shows_passwords_or_key_material(secure):
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
    admin = AdminClient({"bootstrap.servers": secure.address("PLAINTEXT")})
    res = ConfigResource(ResourceType.BROKER, "1")
    entries = admin.describe_configs([res])[res].result(30)
    assert entries["oncelog.add.scram"].is_sensitive and entries["oncelog.add.scram"].value is None
    assert entries["ssl.key.password"].is_sensitive and entries["ssl.keystore.key"].value is None
    assert entries["ssl.keystore.location"].value.endswith("broker.pem")   # a path is not a secret
