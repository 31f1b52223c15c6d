"""Who is on the other end of a connection: a listener's security (TLS, SASL mechanisms, users)
and, per connection on a SASL listener, the SASL exchange (`core.security.sasl.SaslSession` does
the deciding; this module decodes, answers and closes).

Frames a SASL connection sends before it is authenticated (and SaslHandshake/SaslAuthenticate
after, and anything once the session expired) come here instead of the handlers
(`ConnectionAuth.intercepts`). Every refusal is one log line naming the address and, where
known, the user; the broker answers as Kafka does (`docs/security.md` §8) and closes only that
connection. A failed authentication is answered at once and the connection closed after
`connection.failed.authentication.delay.ms`, which slows down password guessing.
"""
from __future__ import annotations

import logging
import secrets
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from oncelog.broker.security.inter_broker import CLUSTER_LOGIN_MECHANISM, ClusterLogin
from oncelog.broker.security.scram_credentials import CredentialsUnavailable
from oncelog.broker.security.tls import ListenerTls
from oncelog.core.security.jaas import JaasConfigError, parse_sasl_jaas_config, plain_users
from oncelog.core.security.listeners import Endpoint, SecurityProtocol, jaas_config_key
from oncelog.core.security.plain import MECHANISM as PLAIN
from oncelog.core.security.plain import PlainServer
from oncelog.core.security.principal import ANONYMOUS, KafkaPrincipal, broker_principal
from oncelog.core.security.sasl import (
    SASL_SERVER_MAX_RECEIVE_SIZE,
    Route,
    SaslServerMechanism,
    SaslSession,
    TokenAnswer,
)
from oncelog.core.security.scram import (
    CredentialShapes,
    ScramCredential,
    ScramMechanism,
    ScramServer,
    username_from_sasl_name,
)
from oncelog.core.topic_config import ConfigError
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey, api_name
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.headers import read_request_header, response_header
from oncelog.protocol.primitives import I32

log = logging.getLogger("oncelog.broker.auth")

SUPPORTED_MECHANISMS = (PLAIN, *(m.mechanism_name for m in ScramMechanism))
# (user, mechanism) -> the stored credential or None; asked once per SCRAM exchange
CredentialLookup = Callable[[str, ScramMechanism], Awaitable[ScramCredential | None]]


@dataclass
class ListenerSecurity:
    """What a listener's settings say about security (built once at start)."""
    endpoint: Endpoint
    tls: ListenerTls | None
    mechanisms: tuple[str, ...]
    plain_users: dict[str, str]
    max_reauth_ms: int
    failed_auth_delay_ms: int
    credentials: CredentialLookup | None = None
    mock_secret: bytes = b""
    cluster: ClusterLogin | None = None   # other brokers of the cluster log in with its credential
    max_receive_size: int = SASL_SERVER_MAX_RECEIVE_SIZE    # sasl.server.max.receive.size
    credential_shapes: CredentialShapes | None = None       # what real credentials look like (the mock's)

    @property
    def name(self) -> str:
        return self.endpoint.name

    @property
    def protocol(self) -> SecurityProtocol:
        return self.endpoint.protocol

    @classmethod
    def from_config(cls, config, endpoint: Endpoint, credentials: CredentialLookup | None,
                    cluster: ClusterLogin | None = None, credential_shapes: CredentialShapes | None = None
                    ) -> ListenerSecurity:
        name = endpoint.name
        tls = ListenerTls(name, config.tls_settings(name)) if endpoint.protocol.uses_tls else None
        mechanisms: tuple[str, ...] = ()
        users: dict[str, str] = {}
        if endpoint.protocol.uses_sasl:
            text = str(config.listener_value(name, "sasl.enabled.mechanisms", "GSSAPI"))
            mechanisms = tuple(m.strip().upper() for m in text.split(",") if m.strip())
            bad = [m for m in mechanisms if m not in SUPPORTED_MECHANISMS]
            if bad or not mechanisms:
                raise ConfigError(f"listener {name}: sasl.enabled.mechanisms={text!r}: oncelog supports "
                                  f"{', '.join(SUPPORTED_MECHANISMS)} (Kafka's default GSSAPI is not)")
            if PLAIN in mechanisms:
                key = jaas_config_key(name, PLAIN)
                jaas = config.get(key)
                if not jaas:
                    raise ConfigError(f"listener {name} enables PLAIN but {key} is not set "
                                      "(user_<name>=\"<password>\" entries of a PlainLoginModule)")
                try:
                    users = plain_users(parse_sasl_jaas_config(jaas))
                except JaasConfigError as e:
                    raise ConfigError(f"{key}: {e}") from None
        return cls(endpoint, tls, mechanisms, users,
                   int(config.listener_value(name, "connections.max.reauth.ms", 0)),
                   int(config.listener_value(name, "connection.failed.authentication.delay.ms", 100)),
                   credentials, secrets.token_bytes(32), cluster,
                   int(config.listener_value(name, "sasl.server.max.receive.size", SASL_SERVER_MAX_RECEIVE_SIZE)),
                   credential_shapes)

    def new_session(self) -> SaslSession | None:
        if not self.mechanisms:
            return None
        return SaslSession(self.mechanisms, self._mechanism_server, self.max_reauth_ms, self.max_receive_size)

    def cluster_session(self) -> SaslSession:
        """On a listener without SASL: the exchange another broker proves itself with (the
        cluster user alone: `ConnectionAuth._prefetch` has no other credential to offer)."""
        return SaslSession((CLUSTER_LOGIN_MECHANISM,), self._mechanism_server)

    def _plain_password(self, user: str) -> str | None:
        if self.cluster is not None and user == self.cluster.user:
            return self.cluster.plain_password(user)
        return self.plain_users.get(user)

    def _mechanism_server(self, mechanism: str) -> SaslServerMechanism:
        if mechanism == PLAIN:
            return PlainServer(self._plain_password)
        scram = ScramMechanism.from_name(mechanism)
        assert scram is not None  # only enabled mechanisms reach here
        # the credential was fetched before the first token is evaluated (ConnectionAuth._prefetch)
        shapes = self.credential_shapes(scram) if self.credential_shapes is not None else None
        return ScramServer(scram, lambda _user: None, secrets.token_bytes, self.mock_secret, mock_shapes=shapes)


@dataclass(frozen=True)
class Outcome:
    """What the connection does with a frame the authenticator took."""
    response: bytes | None = None        # bytes to send (already framed)
    handle: bool = False                 # not ours: handle it as a request
    close: bool = False                  # close after sending (at once)
    close_after_ms: int = 0              # ... or after this delay (a failed authentication)


class ConnectionAuth:
    """One connection's authentication state: its principal, and on a SASL listener the exchange."""

    def __init__(self, listener: ListenerSecurity, peer: str) -> None:
        self.listener = listener
        self.peer = peer
        self.principal: KafkaPrincipal = ANONYMOUS
        self.session = listener.new_session()
        self._user_tried: str | None = None
        # on a listener without SASL: whether a SaslHandshake may still start the cluster login
        # (only as the first request, after an optional ApiVersions)
        self._cluster_login_open = self.session is None and listener.cluster is not None

    @property
    def receive_limit(self) -> int | None:
        return self.session.receive_limit if self.session is not None else None

    def intercepts(self, frame: memoryview, now_ms: int) -> bool:
        """Whether the authenticator takes this frame (asked again for a frame it queued: the
        answer stays the same)."""
        s = self.session
        if s is None:
            return self._cluster_login_starts(frame)
        if not s.authenticated:
            return True
        api_key = _api_key(frame)
        return api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE) or s.expired(now_ms)

    def _cluster_login_starts(self, frame: memoryview) -> bool:
        if not self._cluster_login_open:
            return False
        api_key = _api_key(frame)
        if api_key == ApiKey.SASL_HANDSHAKE:
            self.session = self.listener.cluster_session()
            self._cluster_login_open = False
            return True
        if api_key != ApiKey.API_VERSIONS:
            self._cluster_login_open = False
        return False

    async def take(self, frame: memoryview, now_ms: int,
                   api_versions: Callable[[memoryview], Awaitable[Any]]) -> Outcome:
        s = self.session
        assert s is not None
        if s.expects_raw_token:
            if not await self._prefetch(bytes(frame)):
                return Outcome(close=True)
            return self._token_outcome(s.raw_token(bytes(frame), now_ms), None)
        try:
            header = read_request_header(frame)
        except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
            self._warn(f"unreadable request during SASL authentication: {e}")
            return Outcome(close=True)
        routing = s.route(header.api_key, header.api_version, now_ms)
        body = frame[header.body_offset:]
        corr = header.correlation_id
        r = routing.route
        if r is Route.REQUEST:
            return Outcome(handle=True)
        if r is Route.CLOSE:
            if "expired" in routing.reason:
                log.info("closing connection of %s from %s on %s: %s", self.principal, self.peer,
                         self.listener.name, routing.reason)
            else:
                self._warn(f"{api_name(header.api_key).upper()} {routing.reason}"
                           if "Unexpected" not in routing.reason else routing.reason)
            return Outcome(close=True)
        if r is Route.API_VERSIONS:
            response = await api_versions(frame)
            s.api_versions_answered(valid=True)
            return Outcome(response=response)
        try:
            if r is Route.HANDSHAKE:
                request = entities.decode_request(ApiKey.SASL_HANDSHAKE, header.api_version, body)
                answer = s.handshake(header.api_version, str(request.mechanism))
                out = _framed(ApiKey.SASL_HANDSHAKE, header.api_version, corr, entities.ResponseBuilder(
                    ApiKey.SASL_HANDSHAKE, header.api_version).encode(error_code=answer.error_code,
                                                                      mechanisms=answer.mechanisms))
                if answer.close_after:
                    self._warn(f"unsupported SASL mechanism {request.mechanism!r} (enabled: "
                               f"{', '.join(answer.mechanisms)})")
                    return Outcome(response=out, close_after_ms=self.listener.failed_auth_delay_ms)
                return Outcome(response=out)
            if r is Route.AUTHENTICATE:
                request = entities.decode_request(ApiKey.SASL_AUTHENTICATE, header.api_version, body)
                token = bytes(request.auth_bytes)
                if not await self._prefetch(token):
                    return Outcome(close=True)
                return self._token_outcome(s.authenticate(header.api_version, token, now_ms),
                                           (header.api_version, corr))
        except entities.MalformedRequest as e:
            self._warn(f"malformed {api_name(header.api_key)} request: {e}")
            return Outcome(close=True)
        # REFUSE / REFUSE_AND_CLOSE: ILLEGAL_SASL_STATE in the request's own response
        if r is Route.REFUSE_AND_CLOSE:
            self._warn(routing.reason)
        refusal = _illegal_state(header.api_key, header.api_version, body)
        answer_frame = None if refusal is None else _framed(header.api_key, header.api_version, corr, refusal)
        return Outcome(response=answer_frame, close=r is Route.REFUSE_AND_CLOSE or answer_frame is None)

    def _token_outcome(self, answer: TokenAnswer, v1: tuple[int, int] | None) -> Outcome:
        s = self.session
        assert s is not None
        if answer.failure is not None:
            user = answer.failure.user or self._user_tried
            log.warning("authentication failed: user=%s mechanism=%s from %s on %s: %s", user, s.mechanism,
                        self.peer, self.listener.name, answer.failure)
        elif s.authenticated:
            assert s.principal is not None
            cluster = self.listener.cluster
            # the cluster user's name is checked against the cluster credential alone (_prefetch,
            # _plain_password): authenticated under it, the peer holds that credential
            principal = broker_principal(s.principal.name) if cluster is not None and \
                s.principal.name == cluster.user else s.principal
            if self.principal != principal:
                log.info("authenticated %s%s (%s) from %s on %s", principal, " (a broker)" if principal.broker
                         else "", s.mechanism, self.peer, self.listener.name)
            self.principal = principal
        delay = self.listener.failed_auth_delay_ms if answer.close_after else 0
        if v1 is None:   # v0 framing: the bare token, or nothing on failure
            out = None if answer.auth_bytes is None else I32.pack(len(answer.auth_bytes)) + answer.auth_bytes
            return Outcome(response=out, close_after_ms=delay, close=answer.close_after and delay == 0)
        version, corr = v1
        body = entities.ResponseBuilder(ApiKey.SASL_AUTHENTICATE, version).encode(
            error_code=answer.error_code, error_message=answer.error_message, auth_bytes=answer.auth_bytes or b"",
            session_lifetime=answer.session_lifetime_ms)
        return Outcome(response=_framed(ApiKey.SASL_AUTHENTICATE, version, corr, body), close_after_ms=delay,
                       close=answer.close_after and delay == 0)

    async def _prefetch(self, token: bytes) -> bool:
        """A SCRAM exchange's first token names the user: its credential is fetched now, so the
        (synchronous) mechanism finds it. False: it cannot be known now (the connection closes,
        and the client retries as after a network error)."""
        s = self.session
        assert s is not None
        server = s._server
        if not isinstance(server, ScramServer) or server.complete or server.authorization_id is not None:
            if isinstance(server, PlainServer):
                self._user_tried = _plain_user(token)
            return True
        user = _scram_user(token)
        self._user_tried = user
        credential = None
        lookup = self.listener.credentials
        mechanism = ScramMechanism.from_name(server.mechanism)
        assert mechanism is not None
        cluster = self.listener.cluster
        if cluster is not None and user == cluster.user:
            credential = cluster.scram(mechanism)
        elif not self.listener.protocol.uses_sasl:
            pass   # the cluster login: nobody else logs in on a listener without SASL
        elif user is not None and lookup is not None:
            try:
                credential = await lookup(user, mechanism)
            except CredentialsUnavailable as e:
                self._warn(f"SCRAM credential of {user!r} unknown: {e}")
                return False
        server._credentials = lambda name: credential if name == user else None
        return True

    def _warn(self, why: str) -> None:
        log.warning("closing connection from %s on %s (user %s): %s", self.peer, self.listener.name,
                    self._user_tried or "-", why)


def _api_key(frame: memoryview) -> int:
    return int.from_bytes(frame[0:2], "big", signed=True) if len(frame) >= 2 else -1


def _framed(api_key: int, version: int, corr: int, body: bytes) -> bytes:
    header = response_header(api_key, version, corr)
    return I32.pack(len(header) + len(body)) + header + body


def _illegal_state(api_key: int, version: int, body: memoryview) -> bytes | None:
    if api_key == ApiKey.SASL_HANDSHAKE:
        return entities.ResponseBuilder(api_key, version).encode(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                                                                 mechanisms=())
    if api_key == ApiKey.SASL_AUTHENTICATE:
        return entities.ResponseBuilder(api_key, version).encode(
            error_code=ErrorCode.ILLEGAL_SASL_STATE, error_message="SASL request after authentication",
            auth_bytes=b"", session_lifetime=0)
    from oncelog.broker.handlers import APIS
    api = APIS.get(api_key)
    if api is None:
        return None
    try:
        request = api.decode(version, body)
        return api.error_response(version, request, ErrorCode.ILLEGAL_SASL_STATE)
    except Exception:  # noqa: BLE001 - bad bytes during authentication: the connection just closes
        return None


def _scram_user(token: bytes) -> str | None:
    try:
        parts = token.decode("utf-8").split(",", 3)
        if len(parts) < 3 or not parts[2].startswith("n="):
            return None
        return username_from_sasl_name(parts[2][2:])
    except (UnicodeDecodeError, ValueError):
        return None


def _plain_user(token: bytes) -> str | None:
    parts = token.split(b"\0")
    return parts[1].decode("utf-8", "replace") if len(parts) == 3 else None
