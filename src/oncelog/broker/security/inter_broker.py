"""Brokers among themselves, as Kafka's inter-broker security: which listener they reach each
other on, how they prove who they are, and who a broker accepts as another broker.

- **Who**: every broker of a cluster (and its controller) knows the cluster credential
  (`storage.cluster_credential`: `<log.dirs>/cluster.credential`, 0600, unless
  `controller.sasl.plain.username`/`.password` name it). A connection that authenticated with it
  is the broker principal (`principal.broker_principal`): it holds CLUSTER_ACTION implicitly,
  and the broker-only requests (WriteTxnMarkers, AddPartitionsToTxn v4) accept nobody else,
  whatever ACLs or `super.users` say. No certificate, ACL or stored SCRAM credential can make a
  connection that principal: on every listener the cluster user's name is checked against the
  cluster credential only.
- **Where**: `inter.broker.listener.name`, or the listener named after
  `security.inter.broker.protocol` (Kafka's two ways, one at a time); neither: the first
  listener. A broker registers that listener's advertised address with the controller, so it is
  where the other brokers (and clients, through Metadata) find it.
- **How**: TLS when the listener uses it (peers are checked against the listener's truststore
  and this broker's own certificate chain: brokers on one machine share a key; the broker's key
  is its client certificate when the listener asks for one), then SASL with
  `sasl.mechanism.inter.broker.protocol` (default: the strongest mechanism the listener
  enables). A listener without SASL (PLAINTEXT, SSL) accepts one more exchange than Kafka's: a
  SaslHandshake as a connection's first request starts SCRAM-SHA-512 for the cluster user alone
  (Kafka answers ILLEGAL_SASL_STATE there; its clients never send it), so brokers authenticate on
  every listener and no PLAINTEXT client is ever taken for a broker.
"""
from __future__ import annotations

import secrets
import ssl
from dataclasses import dataclass

from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.core.security.listeners import Endpoint
from oncelog.core.security.plain import MECHANISM as PLAIN
from oncelog.core.security.scram import DEFAULT_ITERATIONS, ScramCredential, ScramMechanism, credential_from_password
from oncelog.storage import cluster_credential as credential_file
from oncelog.storage.cluster_credential import ClusterCredential, CredentialFileError

# what a broker proves itself with on a listener that has no SASL of its own
CLUSTER_LOGIN_MECHANISM = ScramMechanism.SCRAM_SHA_512.mechanism_name
_PREFERENCE = (ScramMechanism.SCRAM_SHA_512.mechanism_name, ScramMechanism.SCRAM_SHA_256.mechanism_name, PLAIN)


def cluster_credential(config: BrokerConfig) -> ClusterCredential:
    """`controller.sasl.plain.username`/`.password` if set, else the data directory's credential
    file. ConfigError when there is neither."""
    user = config["controller.sasl.plain.username"]
    if user:
        return ClusterCredential(user, config["controller.sasl.plain.password"])
    path = credential_file.path_in(config.log_dirs[0])
    try:
        return credential_file.load(path)
    except CredentialFileError as e:
        raise ConfigError(f"no cluster credential: {e} (set controller.sasl.plain.username and "
                          ".password, or start the broker in the data directory of its cluster)") from None


def inter_broker_listener(config: BrokerConfig) -> Endpoint:
    """Kafka's rules: `inter.broker.listener.name` or `security.inter.broker.protocol`, not both."""
    setup = config.listener_setup
    name, protocol = config["inter.broker.listener.name"].strip(), config["security.inter.broker.protocol"].strip()
    if name and protocol:
        raise ConfigError("Only one of inter.broker.listener.name and security.inter.broker.protocol should be set.")
    chosen = name or protocol
    if not chosen:
        return setup.listeners[0]
    try:
        return setup.listener(chosen)
    except KeyError:
        what = "inter.broker.listener.name" if name else "security.inter.broker.protocol"
        raise ConfigError(f"{what}={chosen}: no listener of that name in listeners={config['listeners']} "
                          "(brokers reach each other on one of this broker's listeners)") from None


def inter_broker_mechanism(config: BrokerConfig, listener: Endpoint) -> str:
    """The SASL mechanism brokers use on `listener`: `sasl.mechanism.inter.broker.protocol`, which
    the listener must enable (Kafka's check), else the strongest it enables; on a listener without
    SASL, the cluster login's SCRAM-SHA-512."""
    if not listener.protocol.uses_sasl:
        return CLUSTER_LOGIN_MECHANISM
    text = str(config.listener_value(listener.name, "sasl.enabled.mechanisms", "GSSAPI"))
    enabled = [m.strip().upper() for m in text.split(",") if m.strip()]
    wanted = config["sasl.mechanism.inter.broker.protocol"].strip().upper()
    if wanted:
        if wanted not in enabled:
            raise ConfigError(f"sasl.mechanism.inter.broker.protocol={wanted} must be included in "
                              f"sasl.enabled.mechanisms of listener {listener.name} ({text}) when SASL is "
                              "used for inter-broker communication")
        return wanted
    for m in _PREFERENCE:
        if m in enabled:
            return m
    raise ConfigError(f"listener {listener.name}: no mechanism brokers can use among {text}")


@dataclass(frozen=True)
class InterBrokerLink:
    """How this broker reaches the other brokers."""
    listener: Endpoint
    mechanism: str
    credential: ClusterCredential
    tls: ssl.SSLContext | None

    @classmethod
    def from_config(cls, config: BrokerConfig, credential: ClusterCredential) -> InterBrokerLink:
        listener = inter_broker_listener(config)
        mechanism = inter_broker_mechanism(config, listener)
        tls = peer_tls_context(config, listener.name) if listener.protocol.uses_tls else None
        return cls(listener, mechanism, credential, tls)


def peer_tls_context(config: BrokerConfig, listener: str) -> ssl.SSLContext:
    """A client context for another broker's TLS listener: the listener's truststore and this
    broker's own certificate chain as trust anchors (a shared key needs no CA in the truststore),
    host names checked, and this broker's key as client certificate."""
    s = config.tls_settings(listener)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN   # the own certificate is an anchor though not a CA
    if s.ca_file or s.ca_pem:
        ctx.load_verify_locations(cafile=s.ca_file, cadata=s.ca_pem)
    if s.cert_chain_file:
        ctx.load_verify_locations(cafile=s.cert_chain_file)
        ctx.load_cert_chain(s.cert_chain_file, password=s.key_password)
    else:
        from oncelog.broker.security.tls import _load_inline
        assert s.cert_chain_pem and s.key_pem   # tls_settings checked that one form is given
        ctx.load_verify_locations(cadata=s.cert_chain_pem)
        _load_inline(ctx, s.cert_chain_pem, s.key_pem, s.key_password)
    return ctx


class ClusterLogin:
    """The cluster credential as a listener checks it: the cluster user is authenticated against
    it alone (never a JAAS entry or a stored SCRAM credential of the same name), and a success
    makes the connection the broker principal. SCRAM credentials are derived once per mechanism."""

    def __init__(self, credential: ClusterCredential) -> None:
        self.user = credential.username
        self._password = credential.password
        self._scram: dict[ScramMechanism, ScramCredential] = {}

    def plain_password(self, user: str) -> str | None:
        return self._password if user == self.user else None

    def scram(self, mechanism: ScramMechanism) -> ScramCredential:
        credential = self._scram.get(mechanism)
        if credential is None:
            credential = self._scram[mechanism] = credential_from_password(
                mechanism, self._password, secrets.token_bytes(32), DEFAULT_ITERATIONS)
        return credential
