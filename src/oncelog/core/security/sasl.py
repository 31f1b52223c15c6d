"""A connection's SASL state, as Kafka's `SaslServerAuthenticator` keeps it, with no I/O.

The broker asks `route(api_key, api_version, now_ms)` for every frame that arrives on a SASL
listener (or, while `expects_raw_token`, hands the whole frame to `raw_token`) and does what the
answer says; the handshake and token answers say what to send and whether to close after it.

States and what each accepts (anything else: the connection closes without an answer, except
where an ILLEGAL_SASL_STATE answer is noted):

    INITIAL            ApiVersions (once) -> HANDSHAKE_ONLY, SaslHandshake -> AUTHENTICATE
    HANDSHAKE_ONLY     SaslHandshake -> AUTHENTICATE
    AUTHENTICATE       v1+ handshake: SaslAuthenticate v0-v2, one token each; any other request is
                       answered ILLEGAL_SASL_STATE, then closed.
                       v0 handshake: raw length-prefixed tokens with no request header (what
                       kafka-python 2.0 speaks); a failure closes without an answer.
                       -> COMPLETE or FAILED (the failure answer goes out, then the close)
    COMPLETE           every request; SaslHandshake/SaslAuthenticate answer ILLEGAL_SASL_STATE and
                       the connection stays, unless the handshake starts a re-authentication.
    FAILED             nothing.

Re-authentication (KIP-368): with `connections.max.reauth.ms` > 0 a session expires that long
after it completed (SaslAuthenticate v1+ tells the client, `session_lifetime_ms`). A SaslHandshake
on a COMPLETE connection restarts the exchange if the client has shown it can (it used
SaslAuthenticate v1+) and the last re-authentication started at least a second ago; the mechanism
and the principal must stay the same. After expiry any other request closes the connection.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from oncelog.core.security.principal import KafkaPrincipal
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

# Kafka's sasl.server.max.receive.size: frames before authentication completes are capped here
SASL_SERVER_MAX_RECEIVE_SIZE = 524288
MIN_REAUTH_INTERVAL_MS = 1000
SASL_AUTHENTICATE_VERSIONS = (0, 2)
SASL_HANDSHAKE_VERSIONS = (0, 1)   # never above v1: Java clients <= 2.4 mis-negotiate (KAFKA-9577)


class AuthenticationFailed(Exception):
    """An exchange that failed. `str(self)` is the reason, for the broker's log line only.
    `client_message` is what the client is told (Kafka's SaslAuthenticationException text); None
    means Kafka's generic text, which never says whether the user exists."""

    def __init__(self, reason: str, client_message: str | None = None, user: str | None = None) -> None:
        super().__init__(reason)
        self.client_message = client_message
        self.user = user


class IllegalSaslState(Exception):
    """A token arrived where the mechanism expects none."""


class SaslServerMechanism(Protocol):
    mechanism: str
    authorization_id: str | None

    @property
    def complete(self) -> bool: ...

    def evaluate(self, token: bytes) -> bytes: ...


MechanismFactory = Callable[[str], SaslServerMechanism]


class SaslState(Enum):
    INITIAL = "INITIAL"
    HANDSHAKE_ONLY = "HANDSHAKE_ONLY"
    AUTHENTICATE = "AUTHENTICATE"
    REAUTH_BAD_MECHANISM = "REAUTH_BAD_MECHANISM"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


class Route(Enum):
    API_VERSIONS = "api_versions"          # answer it; then call api_versions_answered(valid)
    HANDSHAKE = "handshake"                # decode SaslHandshake; call handshake()
    AUTHENTICATE = "authenticate"          # decode SaslAuthenticate; call authenticate()
    REQUEST = "request"                    # authenticated: handle as usual
    REFUSE = "refuse"                      # answer ILLEGAL_SASL_STATE; the connection stays
    REFUSE_AND_CLOSE = "refuse_and_close"  # answer ILLEGAL_SASL_STATE, then close
    CLOSE = "close"                        # close without an answer


@dataclass(frozen=True)
class Routing:
    route: Route
    reason: str = ""          # for the log line when the route refuses or closes


@dataclass(frozen=True)
class HandshakeAnswer:
    error_code: ErrorCode
    mechanisms: tuple[str, ...]
    close_after: bool         # after connection.failed.authentication.delay.ms


@dataclass(frozen=True)
class TokenAnswer:
    """The reply to one token. `auth_bytes` None: send nothing (a v0 failure just closes)."""
    error_code: ErrorCode
    error_message: str | None
    auth_bytes: bytes | None
    session_lifetime_ms: int
    close_after: bool
    failure: AuthenticationFailed | None = None   # what to log, with the principal and address


def _generic_message(reauthenticating: bool, mechanism: str) -> str:
    what = "re-authentication" if reauthenticating else "authentication"
    return f"Authentication failed during {what} due to invalid credentials with SASL mechanism {mechanism}"


class SaslSession:
    """One connection on a SASL listener. `mechanisms` are the listener's enabled mechanisms in
    the order they are advertised; `new_server(mechanism)` makes a fresh mechanism server."""

    def __init__(self, mechanisms: tuple[str, ...], new_server: MechanismFactory,
                 max_reauth_ms: int = 0, max_receive_size: int = SASL_SERVER_MAX_RECEIVE_SIZE) -> None:
        if not mechanisms:
            raise ValueError("No SASL mechanisms are enabled")
        self.mechanisms = tuple(mechanisms)
        self._new_server = new_server
        self.max_reauth_ms = max_reauth_ms
        self.max_receive_size = max_receive_size
        self.state = SaslState.INITIAL
        self.raw_tokens = False                 # set by a v0 handshake
        self.principal: KafkaPrincipal | None = None
        self.mechanism: str | None = None
        self.expiry_ms: int | None = None       # None: the session never expires
        self._server: SaslServerMechanism | None = None
        self._client_supports_reauth = False
        self._reauth_from: tuple[str, KafkaPrincipal] | None = None   # (mechanism, principal)
        self._last_reauth_start_ms: int | None = None
        self._bad_mechanism_message = ""

    # ------------------------------------------------------------------ queries
    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.COMPLETE

    @property
    def reauthenticating(self) -> bool:
        return self._reauth_from is not None

    @property
    def expects_raw_token(self) -> bool:
        """The next frame is a bare token (after a v0 handshake), not a request."""
        return self.state is SaslState.AUTHENTICATE and self.raw_tokens

    @property
    def receive_limit(self) -> int | None:
        """The largest frame accepted now (None: the listener's socket.request.max.bytes)."""
        return None if self.state is SaslState.COMPLETE else self.max_receive_size

    def expired(self, now_ms: int) -> bool:
        return self.expiry_ms is not None and now_ms > self.expiry_ms

    # ------------------------------------------------------------------ frames
    def route(self, api_key: int, api_version: int, now_ms: int) -> Routing:
        s = self.state
        if s is SaslState.COMPLETE:
            if api_key == ApiKey.SASL_HANDSHAKE and self._may_reauthenticate(now_ms):
                self._begin_reauthentication(now_ms)
                return Routing(Route.HANDSHAKE)
            if self.expired(now_ms):
                return Routing(Route.CLOSE, "the authenticated session expired (connections.max.reauth.ms)")
            if api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
                return Routing(Route.REFUSE, "SASL request after authentication")
            return Routing(Route.REQUEST)
        if s is SaslState.INITIAL and api_key == ApiKey.API_VERSIONS:
            return Routing(Route.API_VERSIONS)
        if s in (SaslState.INITIAL, SaslState.HANDSHAKE_ONLY) and api_key == ApiKey.SASL_HANDSHAKE:
            if not SASL_HANDSHAKE_VERSIONS[0] <= api_version <= SASL_HANDSHAKE_VERSIONS[1]:
                return self._fail_closed(f"SaslHandshake v{api_version} is not supported")
            return Routing(Route.HANDSHAKE)
        if s is SaslState.AUTHENTICATE and not self.raw_tokens:
            if api_key != ApiKey.SASL_AUTHENTICATE:
                self.state = SaslState.FAILED
                return Routing(Route.REFUSE_AND_CLOSE,
                               f"Unexpected Kafka request of type {_name(api_key)} during SASL authentication.")
            if not SASL_AUTHENTICATE_VERSIONS[0] <= api_version <= SASL_AUTHENTICATE_VERSIONS[1]:
                return self._fail_closed(f"SaslAuthenticate v{api_version} is not supported")
            return Routing(Route.AUTHENTICATE)
        if s is SaslState.REAUTH_BAD_MECHANISM:
            return self._fail_closed(self._bad_mechanism_message)
        return self._fail_closed(f"Unexpected Kafka request of type {_name(api_key)} during SASL handshake "
                                 f"(state {s.value})")

    def api_versions_answered(self, valid: bool) -> None:
        """An ApiVersions with a version we serve moves on to the handshake; an unsupported or
        invalid one was answered with an error and may be retried (the client falls back)."""
        if valid and self.state is SaslState.INITIAL:
            self.state = SaslState.HANDSHAKE_ONLY

    def handshake(self, version: int, mechanism: str) -> HandshakeAnswer:
        self._expect(SaslState.INITIAL, SaslState.HANDSHAKE_ONLY)
        if mechanism not in self.mechanisms:
            self.state = SaslState.FAILED
            return HandshakeAnswer(ErrorCode.UNSUPPORTED_SASL_MECHANISM, self.mechanisms, True)
        self.raw_tokens = version == 0
        if self._reauth_from is not None and self._reauth_from[0] != mechanism:
            # Kafka answers the handshake and fails at the next token
            self._bad_mechanism_message = (
                f"SASL mechanism '{mechanism}' requested by client is not supported for re-authentication "
                f"of mechanism '{self._reauth_from[0]}'")
            self.state = SaslState.REAUTH_BAD_MECHANISM
        else:
            self._server = self._new_server(mechanism)
            self.mechanism = mechanism
            self.state = SaslState.AUTHENTICATE
        return HandshakeAnswer(ErrorCode.NONE, self.mechanisms, False)

    def authenticate(self, version: int, auth_bytes: bytes, now_ms: int) -> TokenAnswer:
        """One SaslAuthenticate request (after a v1 handshake)."""
        self._expect(SaslState.AUTHENTICATE)
        if version > 0:
            self._client_supports_reauth = True
        try:
            token = self._evaluate(auth_bytes, now_ms)
        except AuthenticationFailed as e:
            message = e.client_message or _generic_message(self.reauthenticating, self.mechanism or "")
            return TokenAnswer(ErrorCode.SASL_AUTHENTICATION_FAILED, message, b"", 0, True, e)
        lifetime = self._lifetime_ms() if self.state is SaslState.COMPLETE else 0
        return TokenAnswer(ErrorCode.NONE, None, token, lifetime, False)

    def raw_token(self, token: bytes, now_ms: int) -> TokenAnswer:
        """One bare token (after a v0 handshake). The answer is sent length-prefixed; for PLAIN
        that is four zero bytes. A failure closes the connection without an answer."""
        self._expect(SaslState.AUTHENTICATE)
        try:
            reply = self._evaluate(token, now_ms)
        except AuthenticationFailed as e:
            return TokenAnswer(ErrorCode.SASL_AUTHENTICATION_FAILED, None, None, 0, True, e)
        return TokenAnswer(ErrorCode.NONE, None, reply, 0, False)

    # ------------------------------------------------------------------ internals
    def _evaluate(self, token: bytes, now_ms: int) -> bytes:
        assert self._server is not None
        try:
            reply = self._server.evaluate(token)
        except AuthenticationFailed:
            self.state = SaslState.FAILED
            raise
        except IllegalSaslState as e:
            self.state = SaslState.FAILED
            raise AuthenticationFailed(str(e)) from None
        if not self._server.complete:
            return reply
        principal = KafkaPrincipal.user(self._server.authorization_id or "")
        if self._reauth_from is not None and self._reauth_from[1] != principal:
            self.state = SaslState.FAILED
            old = self._reauth_from[1]
            raise AuthenticationFailed(
                "principal changed during re-authentication",
                f"Cannot change principals during re-authentication from {old.type}.{old.name}: "
                f"{principal.type}.{principal.name}", user=principal.name)
        self.principal = principal
        self.state = SaslState.COMPLETE
        self._reauth_from = None
        self.expiry_ms = now_ms + self.max_reauth_ms if self.max_reauth_ms > 0 else None
        return reply

    def _lifetime_ms(self) -> int:
        return self.max_reauth_ms if self.max_reauth_ms > 0 else 0

    def _may_reauthenticate(self, now_ms: int) -> bool:
        if self.expiry_ms is None or not self._client_supports_reauth:
            return False
        last = self._last_reauth_start_ms
        return last is None or now_ms - last >= MIN_REAUTH_INTERVAL_MS

    def _begin_reauthentication(self, now_ms: int) -> None:
        assert self.mechanism is not None and self.principal is not None
        self._reauth_from = (self.mechanism, self.principal)
        self._last_reauth_start_ms = now_ms
        self._client_supports_reauth = False   # a new exchange shows it again (Kafka: new authenticator)
        self._server = None
        self.state = SaslState.HANDSHAKE_ONLY

    def _fail_closed(self, reason: str) -> Routing:
        self.state = SaslState.FAILED
        return Routing(Route.CLOSE, reason)

    def _expect(self, *states: SaslState) -> None:
        if self.state not in states:
            raise RuntimeError(f"SASL call in state {self.state.value}: route() said otherwise")


def _name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api key {api_key}"
