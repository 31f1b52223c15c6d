"""Listeners, the protocol map, advertised listeners, per-listener settings and TLS settings,
with Kafka's names and checks."""
import pytest

from oncelog.core.security.listeners import (
    SECURITY_SETTINGS,
    Endpoint,
    SecurityProtocol,
    jaas_config_key,
    listener_value,
    parse_endpoints,
    parse_listener_setup,
    parse_protocol_map,
    split_listener_key,
    tls_settings,
)
from oncelog.core.topic_config import ConfigError

P = SecurityProtocol


def test_default_map_and_custom_names():
    setup = parse_listener_setup("PLAINTEXT://:9092,SASL_SSL://0.0.0.0:9093", None, None)
    assert setup.listeners == (Endpoint("PLAINTEXT", "", 9092, P.PLAINTEXT), Endpoint("SASL_SSL", "0.0.0.0", 9093,
                                                                                     P.SASL_SSL))
    setup = parse_listener_setup("client://127.0.0.1:9092,Secure://[::1]:9093",
                                 "CLIENT://broker.example:19092", "CLIENT:PLAINTEXT, SECURE:SASL_SSL")
    assert [str(e) for e in setup.listeners] == ["CLIENT://127.0.0.1:9092", "SECURE://[::1]:9093"]
    assert str(setup.advertised_for("client")) == "CLIENT://broker.example:19092"
    assert setup.advertised_for("SECURE") == setup.listener("secure")       # not advertised: as bound
    assert setup.listener("SECURE").protocol.uses_tls and setup.listener("SECURE").protocol.uses_sasl
    assert setup.listener("SECURE").config_prefix == "listener.name.secure."


@pytest.mark.parametrize("listeners, advertised, pmap, message", [
    ("CLIENT://:9092", None, None, "No security protocol defined for listener CLIENT"),
    ("PLAINTEXT://:9092,PLAINTEXT://:9093", None, None, "different name"),
    ("PLAINTEXT://:9092,SSL://:9092", None, None, "different port"),
    ("PLAINTEXT://host9092", None, None, "unable to parse"),
    ("PLAINTEXT://:70000", None, None, "out of range"),
    ("", None, None, "at least one listener"),
    ("PLAINTEXT://:9092", "SSL://h:9093", None, "not in listeners"),
    ("PLAINTEXT://:9092", "PLAINTEXT://0.0.0.0:9092", None, "nonroutable meta-address"),
    ("A://:1", None, "A:TLS", "unknown security protocol"),
    ("A://:1", None, "A:SSL,a:SSL", "appears twice"),
    ("A://:1", None, "A", "is not NAME:PROTOCOL"),
])
def test_bad_listener_settings(listeners, advertised, pmap, message):
    with pytest.raises(ConfigError, match=message):
        parse_listener_setup(listeners, advertised, pmap)


def test_ports_may_repeat_for_an_ipv4_ipv6_pair_port_0_and_in_advertised():
    pmap = parse_protocol_map("A:PLAINTEXT,B:SSL,C:SSL")
    assert len(parse_endpoints("A://127.0.0.1:9092,B://[::1]:9092", pmap)) == 2
    assert len(parse_endpoints("A://:0,B://:0", pmap)) == 2
    with pytest.raises(ConfigError):
        parse_endpoints("A://127.0.0.1:9092,B://[::1]:9092,C://:9092", pmap)
    setup = parse_listener_setup("A://:9092,B://:9093", "A://lb:443,B://lb:443", "A:PLAINTEXT,B:SSL")
    assert [e.port for e in setup.advertised] == [443, 443]


def test_per_listener_values():
    config = {"ssl.client.auth": "none", "listener.name.ext.ssl.client.auth": "required", "sasl.enabled.mechanisms": ""}
    assert listener_value(config, "EXT", "ssl.client.auth") == "required"
    assert listener_value(config, "INT", "ssl.client.auth") == "none"
    assert listener_value(config, "INT", "sasl.enabled.mechanisms", "GSSAPI") == "GSSAPI"
    assert jaas_config_key("SASL_SSL", "SCRAM-SHA-512") == "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"
    assert split_listener_key("listener.name.ext.ssl.keystore.location") == ("ext", "ssl.keystore.location")
    assert split_listener_key("listener.name.ext.plain.sasl.jaas.config") == ("ext", "plain.sasl.jaas.config")
    assert split_listener_key("listener.name.ext.max.connections") == ("ext", "max.connections")
    assert split_listener_key("listener.name.ext.log.retention.ms") is None
    assert split_listener_key("ssl.keystore.location") is None


def test_tls_settings():
    config = {"ssl.keystore.location": "/etc/oncelog/broker.pem", "ssl.truststore.location": "/etc/oncelog/ca.pem",
              "listener.name.mtls.ssl.client.auth": "required", "ssl.key.password": "k",
              "ssl.cipher.suites": "TLS_AES_128_GCM_SHA256, ECDHE-RSA-AES128-GCM-SHA256"}
    s = tls_settings(config, "MTLS")
    assert s.cert_chain_file == "/etc/oncelog/broker.pem" and s.ca_file == "/etc/oncelog/ca.pem"
    assert s.client_auth == "required" and s.protocols == ("TLSv1.2", "TLSv1.3") and s.key_password == "k"
    assert s.ciphers == "TLS_AES_128_GCM_SHA256:ECDHE-RSA-AES128-GCM-SHA256"
    assert s.principal_mapping_rules == "DEFAULT"
    inline = tls_settings({"ssl.keystore.certificate.chain": "-----BEGIN CERTIFICATE-----...",
                           "ssl.keystore.key": "-----BEGIN PRIVATE KEY-----..."}, "SSL")
    assert inline.cert_chain_pem and inline.key_pem and inline.cert_chain_file is None


@pytest.mark.parametrize("config, message", [
    ({"ssl.keystore.type": "JKS", "ssl.keystore.location": "x"}, "PEM key material only"),
    ({"ssl.keystore.type": "PKCS12", "ssl.keystore.location": "x"}, "openssl pkcs12"),
    ({"ssl.truststore.type": "JKS", "ssl.keystore.location": "x"}, "only PEM"),
    ({}, "has no key material"),
    ({"ssl.keystore.certificate.chain": "x"}, "has no key material"),
    ({"ssl.keystore.location": "x", "ssl.keystore.key": "y"}, "not both"),
    ({"ssl.keystore.location": "x", "ssl.client.auth": "sometimes"}, "none, requested, required"),
    ({"ssl.keystore.location": "x", "ssl.enabled.protocols": "TLSv1.1,TLSv1.2"}, "TLSv1.1 is not supported"),
    ({"ssl.keystore.location": "x", "ssl.enabled.protocols": " , "}, "empty"),
])
def test_bad_tls_settings(config, message):
    with pytest.raises(ConfigError, match=message):
        tls_settings(config, "SSL")


def test_security_settings_parse_their_defaults():
    names = [d.name for d in SECURITY_SETTINGS]
    assert len(names) == len(set(names))
    for d in SECURITY_SETTINGS:
        assert d.parse(None) == d.default
        if d.default not in ("", None):
            d.parse(str(d.default).lower() if d.kind == "boolean" else d.default)
