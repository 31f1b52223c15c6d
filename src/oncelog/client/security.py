"""TLS and SASL for oncelog's client, under librdkafka's names (so a confluent-kafka config works
as it is): `security.protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), `sasl.mechanism`
(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), `sasl.username`, `sasl.password`, `ssl.ca.location`,
`ssl.certificate.location`, `ssl.key.location`, `ssl.key.password`,
`ssl.endpoint.identification.algorithm` (https, the default, checks the broker's host name; none
does not)."""
from __future__ import annotations

import secrets
import ssl
from dataclasses import dataclass

from oncelog.core.security.plain import client_token
from oncelog.core.security.scram import ScramClient, ScramClientError, ScramMechanism
from oncelog.core.topic_config import ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str = ""
    password: str = ""
    ssl_context: ssl.SSLContext | None = None
    check_hostname: bool = True

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @classmethod
    def from_config(cls, cfg: dict) -> ClientSecurity:
        protocol = str(cfg.get("security.protocol", "PLAINTEXT")).upper()
        if protocol not in PROTOCOLS:
            raise ConfigError(f"security.protocol={protocol}: one of {', '.join(PROTOCOLS)}")
        context = None
        check = str(cfg.get("ssl.endpoint.identification.algorithm", "https")).lower() == "https"
        if protocol in ("SSL", "SASL_SSL"):
            context = ssl.create_default_context(cafile=cfg.get("ssl.ca.location") or None)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.check_hostname = check
            if cfg.get("ssl.certificate.location"):
                context.load_cert_chain(cfg["ssl.certificate.location"], cfg.get("ssl.key.location") or None,
                                        cfg.get("ssl.key.password") or None)
        mechanism = None
        if protocol.startswith("SASL_"):
            mechanism = str(cfg.get("sasl.mechanism", "GSSAPI")).upper()
            if mechanism not in MECHANISMS:
                raise ConfigError(f"sasl.mechanism={mechanism}: oncelog's client speaks {', '.join(MECHANISMS)}")
        return cls(protocol, mechanism, str(cfg.get("sasl.username", "")), str(cfg.get("sasl.password", "")),
                   context, check)


class SaslExchange:
    """The client's tokens for one exchange: `first()`, then `next(server_token)` until it
    returns None; `finish(server_token)` checks the server's last word."""

    def __init__(self, security: ClientSecurity) -> None:
        self.mechanism = security.mechanism or ""
        self._plain = self.mechanism == "PLAIN"
        self._security = security
        self._scram: ScramClient | None = None
        if not self._plain:
            mech = ScramMechanism.from_name(self.mechanism)
            assert mech is not None
            self._scram = ScramClient(mech, security.username, security.password, secrets.token_bytes)
        self._step = 0

    def first(self) -> bytes:
        if self._plain:
            return client_token(self._security.username, self._security.password)
        assert self._scram is not None
        return self._scram.first_message()

    def next(self, server_token: bytes) -> bytes | None:
        """The next token, or None when the exchange is complete (after `finish`)."""
        self._step += 1
        if self._plain:
            return None
        assert self._scram is not None
        if self._step == 1:
            try:
                return self._scram.final_message(server_token)
            except ScramClientError as e:
                raise ValueError(str(e)) from None
        try:
            self._scram.verify_server_final(server_token)
        except ScramClientError as e:
            raise ValueError(str(e)) from None
        return None
