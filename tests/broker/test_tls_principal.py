"""The principal of a mutual-TLS connection: the client certificate's name as Kafka prints it,
rewritten by `ssl.principal.mapping.rules` (a real TLS handshake in memory, certificates made
with openssl)."""
from __future__ import annotations

import ssl

import pytest

from oncelog.broker.config import BrokerConfig
from oncelog.broker.security.tls import ListenerTls
from oncelog.core.security.principal import ANONYMOUS, KafkaPrincipal, NoMatchingRule
from oncelog.testing.tls import make_client, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    make_client(pki, "alice", "/CN=alice/O=example")
    return pki


def handshake(server: ListenerTls, client_ctx: ssl.SSLContext) -> ssl.SSLObject:
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    srv = server.context.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (client, srv):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        try:
            srv.do_handshake()
            client.do_handshake()
            return srv
        except ssl.SSLWantReadError:
            continue
    raise AssertionError("handshake did not finish")


def listener(pki, **settings) -> ListenerTls:
    config = BrokerConfig({"listeners": "MTLS://127.0.0.1:0", "listener.security.protocol.map": "MTLS:SSL",
                           "ssl.keystore.location": str(pki.broker_pem()),
                           "ssl.truststore.location": str(pki.ca), **settings})
    return ListenerTls("MTLS", config.tls_settings("MTLS"))


def client(pki, with_cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if with_cert:
        cert, key = pki.client("alice")
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def test_default_rule_gives_the_rfc2253_name(pki):
    tls = listener(pki, **{"ssl.client.auth": "required"})
    assert tls.principal(handshake(tls, client(pki))) == KafkaPrincipal("User", "O=example,CN=alice")


def test_mapping_rules_rewrite_the_name(pki):
    tls = listener(pki, **{"ssl.client.auth": "required",
                           "ssl.principal.mapping.rules": "RULE:^.*CN=([^,]+).*$/$1/U,DEFAULT"})
    assert tls.principal(handshake(tls, client(pki))) == KafkaPrincipal("User", "ALICE")


def test_a_name_no_rule_maps_is_refused(pki):
    tls = listener(pki, **{"ssl.client.auth": "required",
                           "ssl.principal.mapping.rules": "RULE:^CN=nobody$/x/"})
    with pytest.raises(NoMatchingRule):
        tls.principal(handshake(tls, client(pki)))


def test_requested_client_auth_without_a_certificate_is_anonymous(pki):
    tls = listener(pki, **{"ssl.client.auth": "requested"})
    assert tls.principal(handshake(tls, client(pki, with_cert=False))) == ANONYMOUS


def test_inline_pem_key_material(pki):
    key = (pki.directory / "broker.key").read_text()
    chain = (pki.directory / "broker.crt").read_text()
    config = BrokerConfig({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.certificate.chain": chain,
                           "ssl.keystore.key": key, "ssl.truststore.certificates": pki.ca.read_text(),
                           "ssl.client.auth": "required"})
    tls = ListenerTls("SSL", config.tls_settings("SSL"))
    assert tls.principal(handshake(tls, client(pki))).name == "O=example,CN=alice"


def test_only_tls_1_2_and_up(pki):
    tls = listener(pki)
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
