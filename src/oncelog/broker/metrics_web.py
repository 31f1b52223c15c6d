"""TLS and basic authentication for the /metrics endpoint, configured as every Prometheus
exporter is (the exporter-toolkit's web configuration file, `--web.config.file` there,
`metrics.web.config.file` here):

    tls_server_config:
      cert_file: server.pem          # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default),
      client_ca_file: ca.pem                         # VerifyClientCertIfGiven
      min_version: TLS12                             # TLS10..TLS13
    basic_auth_users:
      prometheus: $2b$12$...         # bcrypt hashes only, as the toolkit (`htpasswd -nBC 12 ""`)

That subset of YAML is read here (maps of `key: value`, comments, quoted values); a key the
toolkit has and oncelog does not (`http_server_config`, `rate_limit`, cipher lists) refuses the
start rather than being ignored. bcrypt comes from the `bcrypt` package (`oncelog[metrics-auth]`),
needed only when users are set.

A wrong or missing login is answered 401 with `WWW-Authenticate: Basic`; an unknown user costs a
bcrypt check as a known one does. A login that succeeded is remembered (its password's SHA-256)
so a scrape every few seconds does not pay bcrypt each time."""
from __future__ import annotations

import base64
import hashlib
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncelog.core.topic_config import ConfigError

_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_NONE,
                "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
             "TLS13": ssl.TLSVersion.TLSv1_3}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version"}
_REMEMBERED = 64   # successful logins remembered


def _parse(text: str, source: str) -> dict[str, dict[str, str]]:
    """The two-level maps of a web configuration file."""
    out: dict[str, dict[str, str]] = {}
    section: dict[str, str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indented = line[0] in " \t"
        key, sep, value = line.strip().partition(":")
        value = value.strip()
        if not sep or not key:
            raise ConfigError(f"{source}:{number}: not `key: value`: {raw!r}")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if not indented:
            if value:
                raise ConfigError(f"{source}:{number}: {key} must be a map")
            section = out.setdefault(key, {})
        elif section is None:
            raise ConfigError(f"{source}:{number}: an entry outside any section")
        else:
            section[key] = value
    return out


@dataclass
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)     # user -> bcrypt hash
    _remembered: dict[tuple[str, bytes], bool] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str) -> WebConfig:
        p = Path(path)
        try:
            sections = _parse(p.read_text(), path)
        except OSError as e:
            raise ConfigError(f"metrics.web.config.file={path}: {e}") from None
        unknown = set(sections) - {"tls_server_config", "basic_auth_users"}
        if unknown:
            raise ConfigError(f"metrics.web.config.file={path}: {', '.join(sorted(unknown))} not supported")
        config = cls()
        tls = sections.get("tls_server_config")
        if tls is not None:
            config.tls = _tls_context(tls, p.parent, path)
        users = sections.get("basic_auth_users", {})
        if users:
            try:
                import bcrypt  # noqa: F401 - only checked for here
            except ImportError:
                raise ConfigError(f"metrics.web.config.file={path}: basic_auth_users needs the bcrypt package "
                                  "(pip install 'oncelog[metrics-auth]')") from None
            for user, hashed in users.items():
                if not hashed.startswith(("$2a$", "$2b$", "$2y$")):
                    raise ConfigError(f"metrics.web.config.file={path}: the password of {user} is not a bcrypt hash")
            config.users = {u: h.encode() for u, h in users.items()}
        return config

    # ------------------------------------------------------------------ basic authentication
    def authorized(self, header: str | None) -> bool:
        if not self.users:
            return True
        import bcrypt
        user, password = "", b""
        if header and header[:6].lower() == "basic ":
            try:
                user, _, text = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
                password = text.encode()
            except (ValueError, UnicodeDecodeError):
                return False
        key = (user, hashlib.sha256(password).digest())
        if self._remembered.get(key):
            return True
        hashed = self.users.get(user)
        # an unknown user is checked against a known hash all the same: the time says nothing
        ok = bcrypt.checkpw(password, hashed if hashed is not None else next(iter(self.users.values())))
        ok = ok and hashed is not None
        if ok:
            if len(self._remembered) >= _REMEMBERED:
                self._remembered.clear()
            self._remembered[key] = True
        return ok

    def wrap(self, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        if not self.users:
            return app

        def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if self.authorized(environ.get("HTTP_AUTHORIZATION")):
                return app(environ, start_response)
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="oncelog"'),
                                                ("Content-Type", "text/plain")])
            return [b"Unauthorized\n"]
        return guarded

    # ------------------------------------------------------------------ TLS
    def server_class(self, base: type) -> type:
        if self.tls is None:
            return base
        context = self.tls

        class _TlsServer(base):
            def finish_request(self, request: Any, client_address: Any) -> None:
                # the handshake on the connection's own thread, within the idle timeout
                request.settimeout(getattr(self.RequestHandlerClass, "timeout", None))
                try:
                    request = context.wrap_socket(request, server_side=True)
                except (ssl.SSLError, OSError):
                    request.close()
                    return
                super().finish_request(request, client_address)
        return _TlsServer


def _tls_context(tls: dict[str, str], base: Path, path: str) -> ssl.SSLContext:
    unknown = set(tls) - _TLS_KEYS
    if unknown:
        raise ConfigError(f"metrics.web.config.file={path}: tls_server_config.{', '.join(sorted(unknown))} "
                          "not supported")
    if "cert_file" not in tls or "key_file" not in tls:
        raise ConfigError(f"metrics.web.config.file={path}: tls_server_config needs cert_file and key_file")
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise ConfigError(f"metrics.web.config.file={path}: client_auth_type {auth} is not one of "
                          f"{', '.join(_CLIENT_AUTH)}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS.get(tls.get("min_version", "TLS12"), ssl.TLSVersion.TLSv1_2)
    try:
        context.load_cert_chain(base / tls["cert_file"], base / tls["key_file"])
        context.verify_mode = _CLIENT_AUTH[auth]
        if context.verify_mode != ssl.CERT_NONE:
            if "client_ca_file" not in tls:
                raise ConfigError(f"metrics.web.config.file={path}: client_auth_type {auth} needs client_ca_file")
            context.load_verify_locations(base / tls["client_ca_file"])
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"metrics.web.config.file={path}: {e}") from None
    return context
