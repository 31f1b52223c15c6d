"""TLS for a listener with Python's `ssl`: PEM key material under Kafka's names
(`core.security.listeners.TlsSettings`), TLS 1.2+ only, `ssl.client.auth`, and the peer
certificate's name as principal (`ssl.principal.mapping.rules`).

`ListenerTls.reload()` (SIGHUP) builds a new context from the files and puts it in the place of
the old one: each connection takes the listener's context when it is accepted, so new handshakes
use the new key, certificate and truststore (a CA removed from the file is no longer trusted:
OpenSSL cannot drop a CA from a context, so the context is replaced, never reloaded), and open
connections keep the session they made. Files that fail to load leave the old context in place,
with a log line.
"""
from __future__ import annotations

import logging
import os
import ssl
import tempfile

from oncelog.core.security.listeners import TlsSettings
from oncelog.core.security.principal import ANONYMOUS, KafkaPrincipal, SslPrincipalMapper, subject_dn_from_der

log = logging.getLogger("oncelog.broker.tls")

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_VERIFY = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def server_context(s: TlsSettings) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_VERSIONS[p] for p in s.protocols)
    ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    if s.ciphers:
        ctx.set_ciphers(s.ciphers)
    if s.cert_chain_file:
        ctx.load_cert_chain(s.cert_chain_file, password=s.key_password)
    else:
        assert s.cert_chain_pem and s.key_pem  # tls_settings checked that one form is given
        _load_inline(ctx, s.cert_chain_pem, s.key_pem, s.key_password)
    if s.ca_file or s.ca_pem:
        ctx.load_verify_locations(cafile=s.ca_file, cadata=s.ca_pem)
    ctx.verify_mode = _VERIFY[s.client_auth]
    return ctx


def _load_inline(ctx: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    """`ssl` reads key material from files only: a private 0600 file, removed at once."""
    with tempfile.TemporaryDirectory(prefix="oncelog-tls-") as d:
        path = os.path.join(d, "keystore.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key.strip() + "\n" + chain.strip() + "\n")
        ctx.load_cert_chain(path, password=password)


class ListenerTls:
    """One listener's TLS: the context new handshakes use and its principal mapping."""

    def __init__(self, listener: str, settings: TlsSettings) -> None:
        self.listener = listener
        self.settings = settings
        self.context = server_context(settings)
        self.mapper = SslPrincipalMapper.from_rules(settings.principal_mapping_rules)

    def reload(self) -> bool:
        try:
            context = server_context(self.settings)   # all of it loads, or nothing changes
        except (OSError, ssl.SSLError, ValueError) as e:
            log.warning("listener %s: TLS key material did not reload (%s); keeping the old one", self.listener, e)
            return False
        self.context = context
        log.info("listener %s: TLS key material reloaded", self.listener)
        return True

    def principal(self, ssl_object: ssl.SSLObject | None) -> KafkaPrincipal:
        """Kafka's DefaultKafkaPrincipalBuilder for SSL: the mapped certificate name, ANONYMOUS
        without a certificate. Raises NoMatchingRule when no rule maps the name."""
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return ANONYMOUS
        return KafkaPrincipal.user(self.mapper.name_for(subject_dn_from_der(der)))
