"""Listeners and their security settings under Kafka's names, parsed and checked without I/O.

- `listeners=CLIENT://:9092,SECURE://0.0.0.0:9093`, each name mapped to a security protocol by
  `listener.security.protocol.map` (default: PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL map to
  themselves; any other name must be mapped). Names are case-insensitive (upper-cased), must be
  distinct, and so must ports, except 0 and an IPv4/IPv6 pair (Kafka's rules).
- `advertised.listeners` may repeat ports and may not advertise 0.0.0.0; each of its names must
  be a listener.
- Per-listener settings: `listener.name.<name in lower case>.<setting>` wins over `<setting>`
  (`ssl.*`, `sasl.*`, `connections.max.reauth.ms`, `max.connections`, ...). A SASL mechanism's
  JAAS config is only ever per listener and mechanism:
  `listener.name.<listener>.<mechanism in lower case>.sasl.jaas.config`, as on a Kafka broker
  without a JAAS file.
- TLS key material is PEM: `ssl.keystore.type=PEM` with `ssl.keystore.location` (key and
  certificate chain in one file), or inline `ssl.keystore.certificate.chain` and
  `ssl.keystore.key`; trust from `ssl.truststore.location` or inline `ssl.truststore.certificates`.
  JKS and PKCS12 are refused with a message saying how to convert them.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from oncelog.core.topic_config import ConfigDef, ConfigError


class SecurityProtocol(IntEnum):
    """Kafka's SecurityProtocol ids (BrokerRegistration's Listener.SecurityProtocol)."""
    PLAINTEXT = 0
    SSL = 1
    SASL_PLAINTEXT = 2
    SASL_SSL = 3

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


DEFAULT_PROTOCOL_MAP = {p.name: p for p in SecurityProtocol}
_ENDPOINT = re.compile(r"^(.*)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)$")


@dataclass(frozen=True)
class Endpoint:
    name: str                         # upper case
    host: str                         # "" binds every interface (Kafka stores it as null)
    port: int
    protocol: SecurityProtocol

    @property
    def config_prefix(self) -> str:
        return f"listener.name.{self.name.lower()}."

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_protocol_map(text: str | None) -> dict[str, SecurityProtocol]:
    if not text or not text.strip():
        return dict(DEFAULT_PROTOCOL_MAP)
    out: dict[str, SecurityProtocol] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, proto = item.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"listener.security.protocol.map: {item!r} is not NAME:PROTOCOL")
        name = name.strip().upper()
        if name in out:
            raise ConfigError(f"listener.security.protocol.map: {name} appears twice")
        try:
            out[name] = SecurityProtocol[proto.strip().upper()]
        except KeyError:
            raise ConfigError(f"listener.security.protocol.map: unknown security protocol {proto.strip()!r} "
                              f"(one of {', '.join(p.name for p in SecurityProtocol)})") from None
    return out


def _is_ip(host: str) -> int:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return 0


def parse_endpoints(text: str, protocol_map: Mapping[str, SecurityProtocol], what: str = "listeners",
                    distinct_ports: bool = True) -> list[Endpoint]:
    endpoints: list[Endpoint] = []
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        m = _ENDPOINT.match(item)
        if m is None:
            raise ConfigError(f"{what}: unable to parse {item!r} to a broker endpoint (NAME://host:port)")
        name, host, port = m.group(1).upper(), m.group(2), int(m.group(3))
        if not 0 <= port <= 65535:
            raise ConfigError(f"{what}: port {port} of {item!r} is out of range")
        protocol = protocol_map.get(name)
        if protocol is None:
            raise ConfigError(f"{what}: No security protocol defined for listener {name} "
                              "(add it to listener.security.protocol.map)")
        endpoints.append(Endpoint(name, host, port, protocol))
    names = [e.name for e in endpoints]
    if len(set(names)) != len(names):
        raise ConfigError(f"{what}: Each listener must have a different name, {what}: {text}")
    if distinct_ports:
        by_port: dict[int, list[Endpoint]] = {}
        for e in endpoints:
            if e.port:
                by_port.setdefault(e.port, []).append(e)
        for port, eps in by_port.items():
            if len(eps) == 1:
                continue
            versions = sorted(_is_ip(e.host) for e in eps)
            if versions != [4, 6]:
                raise ConfigError(f"{what}: Each listener must have a different port unless exactly one listener "
                                  f"has an IPv4 address and the other IPv6 address, {what}: {text}, port: {port}")
    return endpoints


@dataclass(frozen=True)
class ListenerSetup:
    listeners: tuple[Endpoint, ...]
    advertised: tuple[Endpoint, ...]      # one per listener, in listener order

    def listener(self, name: str) -> Endpoint:
        for e in self.listeners:
            if e.name == name.upper():
                return e
        raise KeyError(name)

    def advertised_for(self, name: str) -> Endpoint:
        for e in self.advertised:
            if e.name == name.upper():
                return e
        raise KeyError(name)


def parse_listener_setup(listeners: str, advertised: str | None, protocol_map: str | None) -> ListenerSetup:
    pmap = parse_protocol_map(protocol_map)
    bound = parse_endpoints(listeners, pmap)
    if not bound:
        raise ConfigError("listeners: at least one listener is needed")
    if advertised and advertised.strip():
        adv = parse_endpoints(advertised, pmap, "advertised.listeners", distinct_ports=False)
        names = {e.name for e in bound}
        for e in adv:
            if e.name not in names:
                raise ConfigError(f"advertised.listeners: {e.name} is not in listeners "
                                  "(advertised listener names must be a subset of listeners)")
            if e.host == "0.0.0.0" or e.host == "::":
                raise ConfigError(f"advertised.listeners cannot use the nonroutable meta-address {e.host}. "
                                  "Use a routable IP address.")
        by_name = {e.name: e for e in adv}
        advertised_eps = tuple(by_name.get(e.name, e) for e in bound)
    else:
        advertised_eps = tuple(bound)
    return ListenerSetup(tuple(bound), advertised_eps)


def listener_value(config: Mapping[str, Any], listener: str, key: str, default: Any = None) -> Any:
    """`listener.name.<listener>.<key>` if set, else `<key>`, else `default`."""
    prefixed = f"listener.name.{listener.lower()}.{key}"
    if config.get(prefixed) not in (None, ""):
        return config[prefixed]
    value = config.get(key)
    return default if value in (None, "") else value


def jaas_config_key(listener: str, mechanism: str) -> str:
    return f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"


# ------------------------------------------------------------------ TLS settings of a listener

CLIENT_AUTH = ("none", "requested", "required")
TLS_VERSIONS = ("TLSv1.2", "TLSv1.3")


@dataclass(frozen=True)
class TlsSettings:
    """What the broker needs to build an `ssl.SSLContext` for one listener."""
    cert_chain_file: str | None        # PEM file with the private key and the certificate chain
    cert_chain_pem: str | None         # inline PEM (ssl.keystore.certificate.chain)
    key_pem: str | None                # inline PEM (ssl.keystore.key)
    key_password: str | None
    ca_file: str | None
    ca_pem: str | None
    client_auth: str                   # none | requested | required
    protocols: tuple[str, ...]         # subset of TLS_VERSIONS
    ciphers: str | None                # OpenSSL cipher list built from ssl.cipher.suites, or None
    principal_mapping_rules: str


def tls_settings(config: Mapping[str, Any], listener: str) -> TlsSettings:
    get: Callable[..., Any] = lambda key, default=None: listener_value(config, listener, key, default)  # noqa: E731
    store_type = str(get("ssl.keystore.type", "PEM")).upper()
    if store_type != "PEM":
        raise ConfigError(f"ssl.keystore.type={store_type} for listener {listener}: oncelog reads PEM key "
                          "material only (convert with `openssl pkcs12 -in store.p12 -nodes -out store.pem`, "
                          "or `keytool -importkeystore -deststoretype PKCS12` first for JKS)")
    trust_type = str(get("ssl.truststore.type", "PEM")).upper()
    if trust_type != "PEM":
        raise ConfigError(f"ssl.truststore.type={trust_type} for listener {listener}: only PEM is supported")
    location, chain, key = get("ssl.keystore.location"), get("ssl.keystore.certificate.chain"), get("ssl.keystore.key")
    if location and (chain or key):
        raise ConfigError(f"listener {listener}: set ssl.keystore.location or ssl.keystore.certificate.chain/"
                          "ssl.keystore.key, not both")
    if not location and not (chain and key):
        raise ConfigError(f"listener {listener} uses TLS but has no key material: set ssl.keystore.location "
                          "(PEM with key and certificate chain) or ssl.keystore.certificate.chain and "
                          "ssl.keystore.key")
    client_auth = str(get("ssl.client.auth", "none")).lower()
    if client_auth not in CLIENT_AUTH:
        raise ConfigError(f"ssl.client.auth={client_auth}: one of {', '.join(CLIENT_AUTH)}")
    protocols = tuple(p.strip() for p in str(get("ssl.enabled.protocols", "TLSv1.2,TLSv1.3")).split(",") if p.strip())
    for p in protocols:
        if p not in TLS_VERSIONS:
            raise ConfigError(f"ssl.enabled.protocols: {p} is not supported (TLSv1.2 and TLSv1.3 only)")
    if not protocols:
        raise ConfigError("ssl.enabled.protocols is empty")
    suites = get("ssl.cipher.suites")
    return TlsSettings(
        cert_chain_file=location or None, cert_chain_pem=chain or None, key_pem=key or None,
        key_password=get("ssl.key.password") or get("ssl.keystore.password") or None,
        ca_file=get("ssl.truststore.location") or None, ca_pem=get("ssl.truststore.certificates") or None,
        client_auth=client_auth, protocols=protocols,
        ciphers=":".join(s.strip() for s in str(suites).split(",") if s.strip()) if suites else None,
        principal_mapping_rules=str(get("ssl.principal.mapping.rules", "DEFAULT")))


# ------------------------------------------------------------------ the settings, for BrokerConfig

SECURITY_SETTINGS: tuple[ConfigDef, ...] = (
    ConfigDef("listener.security.protocol.map", "string",
              "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
              "Listener name -> security protocol."),
    ConfigDef("inter.broker.listener.name", "string", "", "The listener brokers reach each other on "
              "(default: the first listener); a broker registers its address with the controller."),
    ConfigDef("security.inter.broker.protocol", "string", "", "Kafka's other way to name the inter-broker "
              "listener: the listener named after this protocol (not together with inter.broker.listener.name)."),
    ConfigDef("sasl.mechanism.inter.broker.protocol", "string", "", "SASL mechanism of brokers on a SASL "
              "inter-broker listener (default: SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN, the first the listener "
              "enables)."),
    ConfigDef("ssl.keystore.type", "string", "PEM", "PEM only."),
    ConfigDef("ssl.keystore.location", "string", "", "PEM file with the private key and certificate chain."),
    ConfigDef("ssl.keystore.password", "string", "", "Password of an encrypted key in ssl.keystore.location."),
    ConfigDef("ssl.key.password", "string", "", "Password of the private key."),
    ConfigDef("ssl.keystore.certificate.chain", "string", "", "Inline PEM certificate chain."),
    ConfigDef("ssl.keystore.key", "string", "", "Inline PEM private key (PKCS#8)."),
    ConfigDef("ssl.truststore.type", "string", "PEM", "PEM only."),
    ConfigDef("ssl.truststore.location", "string", "", "PEM file of CA certificates for client certificates."),
    ConfigDef("ssl.truststore.password", "string", "", "Accepted and ignored (PEM trust stores have none)."),
    ConfigDef("ssl.truststore.certificates", "string", "", "Inline PEM CA certificates."),
    ConfigDef("ssl.client.auth", "string", "none", "Client certificates: none, requested or required.",
              choices=CLIENT_AUTH),
    ConfigDef("ssl.enabled.protocols", "string", "TLSv1.2,TLSv1.3", "TLS versions (1.2 and 1.3 only)."),
    ConfigDef("ssl.cipher.suites", "string", "", "Cipher suites (OpenSSL names); empty: Python's defaults."),
    ConfigDef("ssl.principal.mapping.rules", "string", "DEFAULT", "Certificate DN -> principal name."),
    ConfigDef("sasl.enabled.mechanisms", "string", "GSSAPI",
              "Mechanisms of SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (Kafka's default GSSAPI is "
              "not supported, so a SASL listener needs this set)."),
    ConfigDef("sasl.server.max.receive.size", "int", 524288, "Largest frame before authentication.", minimum=1),
    ConfigDef("connections.max.reauth.ms", "long", 0, "Session lifetime of SASL connections (KIP-368); 0: "
              "never expires.", minimum=0),
    ConfigDef("connection.failed.authentication.delay.ms", "int", 100, "Delay before a connection that "
              "failed authentication is closed.", minimum=0),
    ConfigDef("authorizer.class.name", "string", "", "Any non-empty value enables oncelog's authorizer "
              "(Kafka's org.apache.kafka.metadata.authorizer.StandardAuthorizer is accepted)."),
    ConfigDef("super.users", "string", "", "Principals allowed everything, separated by ';'."),
    ConfigDef("allow.everyone.if.no.acl.found", "boolean", False, "Allow actions on resources without ACLs."),
    ConfigDef("quota.window.num", "int", 11, "Samples kept for client quota rates.", minimum=1),
    ConfigDef("quota.window.size.seconds", "int", 1, "Length of one quota sample.", minimum=1),
    ConfigDef("max.connections", "int", 2**31 - 1, "Connections the broker holds (per listener with the "
              "listener.name.<l>. prefix); at the limit it accepts no more until one closes.", minimum=0),
    ConfigDef("max.connections.per.ip", "int", 2**31 - 1, "Connections from one address; more are closed as "
              "they arrive.", minimum=0),
    ConfigDef("max.connections.per.ip.overrides", "string", "", "host:count,... exceptions."),
    ConfigDef("max.connection.creation.rate", "int", 2**31 - 1, "New connections a second the broker accepts "
              "(per listener with the listener.name.<l>. prefix); faster ones wait.", minimum=0),
    ConfigDef("connections.max.idle.ms", "long", 600000, "A connection with no traffic for this long is closed "
              "(negative: never)."),
    ConfigDef("oncelog.add.scram", "string", "", "Bootstrap SCRAM credentials, as `oncelog serve "
              "--add-scram` (kafka-storage syntax, several separated by commas)."),
)

# settings that `listener.name.<l>.` may override (Kafka's reconfigurable listener configs)
LISTENER_OVERRIDABLE_PREFIXES = ("ssl.", "sasl.", "connections.max.reauth.ms", "max.connections",
                                 "max.connection.creation.rate", "connection.failed.authentication.delay.ms")
_LISTENER_KEY = re.compile(r"^listener\.name\.([a-z0-9_\-]+)\.(.+)$")


def split_listener_key(key: str) -> tuple[str, str] | None:
    """('ext', 'ssl.keystore.location') for `listener.name.ext.ssl.keystore.location`; None for
    a key that is not a per-listener override or names a setting that cannot be overridden."""
    m = _LISTENER_KEY.match(key)
    if m is None:
        return None
    listener, rest = m.group(1), m.group(2)
    if rest.endswith(".sasl.jaas.config") or rest.startswith(LISTENER_OVERRIDABLE_PREFIXES):
        return listener, rest
    return None
