"""SASL/PLAIN (RFC 4616), server side as Kafka's `PlainSaslServer`: one token
`authzid NUL authcid NUL passwd`, answered with an empty token.

Users come from the listener's JAAS config (`jaas.plain_users`). Passwords are compared in
constant time, and an unknown user costs the same comparison as a known one, so neither the
answer nor its timing says which users exist. The messages are Kafka's: PLAIN failures are
`SaslAuthenticationException`s, whose text the client sees.
"""
from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping

from oncelog.core.security.sasl import AuthenticationFailed, IllegalSaslState

MECHANISM = "PLAIN"
_NO_USER = b"\0" * 32


class PlainServer:
    mechanism = MECHANISM

    def __init__(self, users: Mapping[str, str] | Callable[[str], str | None]) -> None:
        self._password_of = users.get if isinstance(users, Mapping) else users
        self.complete = False
        self.authorization_id: str | None = None

    def evaluate(self, token: bytes) -> bytes:
        if self.complete:
            raise IllegalSaslState("PLAIN exchange already complete")
        try:
            text = bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("PLAIN token is not UTF-8",
                                       "Invalid SASL/PLAIN response: not UTF-8") from None
        parts = text.split("\0", 3)
        if len(parts) != 3:
            raise AuthenticationFailed(
                f"PLAIN token has {len(parts)} parts",
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}")
        authzid, username, password = parts
        if not username:
            raise AuthenticationFailed("empty username", "Authentication failed: username not specified")
        if not password:
            raise AuthenticationFailed("empty password", "Authentication failed: password not specified")
        expected = self._password_of(username)
        ok = hmac.compare_digest(password.encode(), expected.encode() if expected is not None else _NO_USER)
        if expected is None or not ok:
            raise AuthenticationFailed(
                "unknown user" if expected is None else "wrong password",
                "Authentication failed: Invalid username or password", user=username)
        if authzid and authzid != username:
            raise AuthenticationFailed(
                f"authorization id {authzid!r} differs from the username",
                "Authentication failed: Client requested an authorization id that is different from username",
                user=username)
        self.authorization_id = username
        self.complete = True
        return b""


def client_token(username: str, password: str, authzid: str = "") -> bytes:
    """The one PLAIN token a client sends (tests, and the broker's own links)."""
    return f"{authzid}\0{username}\0{password}".encode()
