"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677; Kafka's KIP-84): credentials, the
server's exchange as a state machine, a small client, and kafka-storage's `--add-scram` syntax.

Exchange (server side, `ScramServer.evaluate` once per client token):

    RECEIVE_CLIENT_FIRST  -- client-first  n,[a=authzid],n=name,r=cnonce  -->  server-first
                             r=cnonce+snonce,s=salt,i=iterations
    RECEIVE_CLIENT_FINAL  -- client-final  c=biws,r=nonce,p=proof         -->  server-final
                             v=signature
    COMPLETE | FAILED

Checks, each failing the exchange (Kafka's SASL_AUTHENTICATION_FAILED, never an `e=` message):
Kafka's grammar for both client messages (ASCII names, `=2C`/`=3D` escapes, base64 proof, only
the "n" GS2 header: no channel binding); the client-final nonce equal to the server-first one,
character for character (CVE-2024-56128: Kafka before 3.7.2 / 3.8.1 checked only a suffix); the
proof, `H(ClientSignature XOR proof) == StoredKey` with `hmac.compare_digest`; an authzid, if
given, equal to the user. An unknown user is not refused at the first message as Kafka does:
following RFC 5802 §5.1 the server answers with a salt derived from a per-broker secret and
fails at the proof, so the exchange does not reveal which users exist.

Messages are read as sent: the AuthMessage uses the client's own client-first-bare and
client-final-without-proof text (Kafka re-renders them; the same for every client there is).

Only the StoredKey, ServerKey, salt and iteration count are kept (Kafka's
`UserScramCredentialRecord`); the server never sees or derives a password during an exchange,
so an exchange costs a few HMACs, not a PBKDF2.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from oncelog.core.security.sasl import AuthenticationFailed, IllegalSaslState

RandomBytes = Callable[[int], bytes]
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384   # Kafka's ScramMechanism / ScramControlManager
DEFAULT_ITERATIONS = 4096                      # kafka-storage and kafka-configs default


class ScramMechanism(Enum):
    """Kafka's ScramMechanism: the type byte is the wire value (credential APIs, records)."""
    SCRAM_SHA_256 = (1, "SCRAM-SHA-256", "sha256")
    SCRAM_SHA_512 = (2, "SCRAM-SHA-512", "sha512")

    def __init__(self, type_: int, mechanism_name: str, hash_name: str) -> None:
        self.type = type_
        self.mechanism_name = mechanism_name
        self.hash_name = hash_name

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size

    @classmethod
    def from_name(cls, name: str) -> ScramMechanism | None:
        return _BY_NAME.get(name)

    @classmethod
    def from_type(cls, type_: int) -> ScramMechanism | None:
        return _BY_TYPE.get(type_)


_BY_NAME = {m.mechanism_name: m for m in ScramMechanism}
_BY_TYPE = {m.type: m for m in ScramMechanism}
MECHANISMS = tuple(_BY_NAME)


# ------------------------------------------------------------------ credentials

@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:  # keys stay out of logs, as in Kafka's toString
        return f"ScramCredential(iterations={self.iterations}, salt=[hidden], keys=[hidden])"


def _hmac(mechanism: ScramMechanism, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, mechanism.hash_name).digest()


def _hash(mechanism: ScramMechanism, data: bytes) -> bytes:
    return hashlib.new(mechanism.hash_name, data).digest()


def salted_password(mechanism: ScramMechanism, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) = PBKDF2-HMAC. Passwords are UTF-8 without SASLprep, as in Kafka."""
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode(), salt, iterations)


def credential_from_salted_password(mechanism: ScramMechanism, salt: bytes, salted: bytes,
                                    iterations: int) -> ScramCredential:
    """What AlterUserScramCredentials carries (the client salts) becomes a stored credential."""
    client_key = _hmac(mechanism, salted, b"Client Key")
    return ScramCredential(bytes(salt), _hash(mechanism, client_key),
                           _hmac(mechanism, salted, b"Server Key"), iterations)


def credential_from_password(mechanism: ScramMechanism, password: str, salt: bytes,
                             iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    return credential_from_salted_password(mechanism, salt, salted_password(mechanism, password, salt, iterations),
                                           iterations)


@dataclass(frozen=True, order=True)
class CredentialShape:
    """What a server-first message shows of a credential besides the salt itself."""
    salt_length: int
    iterations: int


DEFAULT_SHAPE = CredentialShape(32, DEFAULT_ITERATIONS)   # what `--add-scram` makes
# a mechanism's credential shapes -> how many stored credentials have each
CredentialShapes = Callable[[ScramMechanism], Mapping[CredentialShape, int]]


def mock_credential(mechanism: ScramMechanism, secret: bytes, username: str,
                    shapes: Mapping[CredentialShape, int]) -> ScramCredential:
    """RFC 5802 §5.1's made-up credential for a user that does not exist, the same at every try:
    its salt derived from a server secret, its salt length and iteration count drawn (by the
    same derivation) from those of the stored credentials, in their proportions, so that a
    server-first message does not tell whether the user exists. With none stored,
    `DEFAULT_SHAPE`."""
    seed = _hmac(mechanism, secret, f"{mechanism.mechanism_name}\0{username}".encode())
    shape = DEFAULT_SHAPE
    total = sum(shapes.values())
    if total:
        pick = int.from_bytes(seed[:8], "big") % total
        for candidate in sorted(shapes):
            pick -= shapes[candidate]
            if pick < 0:
                shape = candidate
                break
    salt = b"".join(_hmac(mechanism, seed, b"salt%d" % block)
                    for block in range(-(-shape.salt_length // mechanism.digest_size)))
    return ScramCredential(salt[:shape.salt_length], b"", b"", shape.iterations)


def check_iterations(mechanism: ScramMechanism, iterations: int) -> str | None:
    """Kafka's bounds (UNACCEPTABLE_CREDENTIAL): the error text, or None if acceptable."""
    if iterations < MIN_ITERATIONS:
        return "Too few iterations"
    if iterations > MAX_ITERATIONS:
        return "Too many iterations"
    return None


# ------------------------------------------------------------------ names

def sasl_name(username: str) -> str:
    """RFC 5802's saslname: '=' as '=3D' and ',' as '=2C'."""
    return username.replace("=", "=3D").replace(",", "=2C")


def username_from_sasl_name(name: str) -> str:
    """Kafka's ScramFormatter.username: any '=' left after the two escapes is an error."""
    unescaped = name.replace("=2C", ",")
    if "=" in unescaped.replace("=3D", ""):
        raise ValueError(f"Invalid username: {name}")
    return unescaped.replace("=3D", "=")


# ------------------------------------------------------------------ message grammar (Kafka's)

_VALUE_SAFE = r"[\x01-\x2b\x2d-\x3c\x3e-\x7f]"   # [\x01-\x7F] minus '=' and ','
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"                # [\x01-\x7F] minus ','
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"            # [\x21-\x7E] minus ','
_SASLNAME = rf"(?:{_VALUE_SAFE}|=2C|=3D)+"
_B64 = r"(?:[a-zA-Z0-9/+]{4})*(?:[a-zA-Z0-9/+]{3}=|[a-zA-Z0-9/+]{2}==)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"
_CLIENT_FIRST = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,(?P<bare>n=(?P<name>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})"
    rf"(?P<extensions>{_EXTENSIONS}))")
_SERVER_FIRST = re.compile(rf"r=(?P<nonce>{_PRINTABLE}),s=(?P<salt>{_B64}),i=(?P<iterations>[0-9]+){_EXTENSIONS}")
_CLIENT_FINAL = re.compile(
    rf"(?P<without_proof>c=(?P<channel>{_B64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),p=(?P<proof>{_B64})")
_SERVER_FINAL = re.compile(rf"(?:e=(?P<error>{_VALUE_SAFE}+))|(?:v=(?P<signature>{_B64})){_EXTENSIONS}")


def _text(token: bytes) -> str:
    try:
        return bytes(token).decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed("SCRAM message is not UTF-8") from None


def _extensions(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if part)


# ------------------------------------------------------------------ the server

class ScramState(Enum):
    RECEIVE_CLIENT_FIRST = "RECEIVE_CLIENT_FIRST"
    RECEIVE_CLIENT_FINAL = "RECEIVE_CLIENT_FINAL"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


class ScramServer:
    """One exchange. `credentials(username)` returns the stored credential or None;
    `random_bytes(n)` supplies the server nonce (`server_nonce`, if given, replaces it: the RFC
    test vectors); `mock_secret` (a per-broker random secret) and `mock_shapes` (the stored
    credentials' shapes) make what a user that does not exist is shown (`mock_credential`)."""

    def __init__(self, mechanism: ScramMechanism, credentials: Callable[[str], ScramCredential | None],
                 random_bytes: RandomBytes, mock_secret: bytes, server_nonce: str | None = None,
                 mock_shapes: Mapping[CredentialShape, int] | None = None) -> None:
        self.mechanism = mechanism.mechanism_name
        self._mech = mechanism
        self._credentials = credentials
        self._random = random_bytes
        self._mock_secret = mock_secret
        self._mock_shapes = mock_shapes or {}
        self._server_nonce = server_nonce
        self.state = ScramState.RECEIVE_CLIENT_FIRST
        self.authorization_id: str | None = None
        self._credential: ScramCredential | None = None
        self._unknown_user = False
        self._client_first_bare = ""
        self._server_first = ""

    @property
    def complete(self) -> bool:
        return self.state is ScramState.COMPLETE

    def evaluate(self, token: bytes) -> bytes:
        try:
            if self.state is ScramState.RECEIVE_CLIENT_FIRST:
                return self._client_first(_text(token))
            if self.state is ScramState.RECEIVE_CLIENT_FINAL:
                return self._client_final(_text(token))
        except AuthenticationFailed:
            self.state = ScramState.FAILED
            self._credential = None
            raise
        raise IllegalSaslState(f"Unexpected challenge in Sasl server state {self.state.value}")

    def _client_first(self, text: str) -> bytes:
        m = _CLIENT_FIRST.fullmatch(text)
        if m is None:
            raise AuthenticationFailed("Invalid SCRAM client first message format")
        try:
            username = username_from_sasl_name(m.group("name"))
        except ValueError as e:
            raise AuthenticationFailed(str(e)) from None
        if "tokenauth" in _extensions(m.group("extensions")):
            # delegation tokens (KIP-48) are not implemented: no token id is ever valid
            raise AuthenticationFailed("Token Authentication failed: delegation tokens are not supported",
                                       user=username)
        authzid = m.group("authzid")
        if authzid is not None and authzid != m.group("name"):
            raise AuthenticationFailed(
                "authorization id differs from the username",
                "Authentication failed: Client requested an authorization id that is different from username",
                user=username)
        credential = self._credentials(username)
        if credential is not None and credential.iterations < MIN_ITERATIONS:
            raise AuthenticationFailed(f"Iterations {credential.iterations} is less than the minimum "
                                       f"{MIN_ITERATIONS} for {self.mechanism}", user=username)
        if credential is None:
            self._unknown_user = True
            credential = mock_credential(self._mech, self._mock_secret, username, self._mock_shapes)
        self._credential = credential
        self.authorization_id = username
        self._client_first_bare = m.group("bare")
        nonce = m.group("nonce") + (self._server_nonce or self._random(24).hex())
        self._server_first = (f"r={nonce},s={base64.b64encode(credential.salt).decode()},"
                              f"i={credential.iterations}")
        self.state = ScramState.RECEIVE_CLIENT_FINAL
        return self._server_first.encode()

    def _client_final(self, text: str) -> bytes:
        user = self.authorization_id
        m = _CLIENT_FINAL.fullmatch(text)
        if m is None:
            raise AuthenticationFailed("Invalid SCRAM client final message format", user=user)
        if m.group("nonce") != self._server_first[2:self._server_first.index(",")]:
            raise AuthenticationFailed("Invalid client nonce in the final client message.", user=user)
        if self._unknown_user:
            raise AuthenticationFailed("Authentication failed: Invalid user credentials", user=user)
        assert self._credential is not None
        proof = base64.b64decode(m.group("proof"))
        auth_message = f"{self._client_first_bare},{self._server_first},{m.group('without_proof')}".encode()
        stored_key = self._credential.stored_key
        signature = _hmac(self._mech, stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthenticationFailed("Invalid client credentials (proof of the wrong length)", user=user)
        client_key = bytes(a ^ b for a, b in zip(signature, proof))
        if not hmac.compare_digest(_hash(self._mech, client_key), stored_key):
            raise AuthenticationFailed("Invalid client credentials", user=user)
        server_signature = _hmac(self._mech, self._credential.server_key, auth_message)
        self._credential = None
        self.state = ScramState.COMPLETE
        return b"v=" + base64.b64encode(server_signature)


# ------------------------------------------------------------------ a client (tests, broker links)

class ScramClientError(Exception):
    pass


class ScramClient:
    """The client's half: `first_message()`, `final_message(server_first)`,
    `verify_server_final(server_final)`."""

    def __init__(self, mechanism: ScramMechanism, username: str, password: str, random_bytes: RandomBytes,
                 max_iterations: int = MAX_ITERATIONS, client_nonce: str | None = None) -> None:
        self._mech = mechanism
        self._password = password
        self._bare = f"n={sasl_name(username)},r={client_nonce or random_bytes(24).hex()}"
        self._max_iterations = max_iterations
        self._server_signature: bytes | None = None

    def first_message(self) -> bytes:
        return ("n,," + self._bare).encode()

    def final_message(self, server_first: bytes) -> bytes:
        text = bytes(server_first).decode()
        m = _SERVER_FIRST.fullmatch(text)
        if m is None:
            raise ScramClientError(f"Invalid SCRAM server first message format: {text}")
        client_nonce = self._bare.split(",r=", 1)[1]
        nonce = m.group("nonce")
        if not nonce.startswith(client_nonce) or nonce == client_nonce:
            raise ScramClientError("server nonce does not extend the client nonce")
        iterations = int(m.group("iterations"))
        if iterations < MIN_ITERATIONS:
            # Kafka's ScramSaslClient: a server asking for less makes the proof cheap to crack offline
            raise ScramClientError(f"Requested iterations {iterations} is less than the minimum {MIN_ITERATIONS} "
                                   f"for {self._mech.mechanism_name}")
        if iterations > self._max_iterations:
            raise ScramClientError(f"Invalid SCRAM server first message format: invalid iterations {iterations}")
        salted = salted_password(self._mech, self._password, base64.b64decode(m.group("salt")), iterations)
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        client_key = _hmac(self._mech, salted, b"Client Key")
        signature = _hmac(self._mech, _hash(self._mech, client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = _hmac(self._mech, _hmac(self._mech, salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify_server_final(self, server_final: bytes) -> None:
        m = _SERVER_FINAL.fullmatch(bytes(server_final).decode())
        if m is None or m.group("error") is not None:
            raise ScramClientError(f"server refused: {bytes(server_final)!r}")
        if self._server_signature is None or not hmac.compare_digest(
                base64.b64decode(m.group("signature")), self._server_signature):
            raise ScramClientError("Invalid server signature in server final message")


# ------------------------------------------------------------------ kafka-storage --add-scram

class AddScramError(ValueError):
    pass


@dataclass(frozen=True)
class AddScram:
    """One `--add-scram` argument: a user's credential for one mechanism."""
    mechanism: ScramMechanism
    name: str
    credential: ScramCredential


def _split_component(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise AddScramError(f"No equals sign found in SCRAM component: {text}")
    if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
        value = value[1:-1]
    return key, value


def parse_add_scram(argument: str, random_bytes: RandomBytes) -> AddScram:
    """kafka-storage's syntax (ScramParser): `SCRAM-SHA-256=[name=alice,password=secret]`, with
    optional `iterations=` (default 4096), `salt=` (base64) and `saltedpassword=` (base64, with
    salt, instead of password). Messages are Kafka's."""
    argument = argument.strip()
    mech_name, sep, config = argument.partition("=")
    if not sep:
        raise AddScramError(f"Failed to find equals sign in SCRAM argument '{argument}'")
    mechanism = ScramMechanism.from_name(mech_name)
    if mechanism is None:
        raise AddScramError(f"The add-scram mechanism {mech_name} is not supported.")
    if not config.startswith("["):
        raise AddScramError("Expected configuration string to start with [")
    if not config.endswith("]"):
        raise AddScramError("Expected configuration string to end with ]")
    components = dict(_split_component(c) for c in config[1:-1].split(","))
    name = components.pop("name", None)
    if name is None:
        raise AddScramError("You must supply 'name' to add-scram")

    def b64(key: str) -> bytes | None:
        value = components.pop(key, None)
        if value is None:
            return None
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            label = {"salt": "salt", "saltedpassword": "saltedPassword"}[key]
            raise AddScramError(f"Failed to decode given {label}: {value}") from None

    salt = b64("salt")
    iterations_text = components.pop("iterations", None)
    try:
        iterations = DEFAULT_ITERATIONS if iterations_text is None else int(iterations_text)
    except ValueError:
        raise AddScramError(f"Failed to parse iterations count: {iterations_text}") from None
    password = components.pop("password", None)
    salted = b64("saltedpassword") if password is None else None
    if password is None and salted is None:
        raise AddScramError("You must supply one of 'password' or 'saltedpassword' to add-scram")
    if password is None and salt is None:
        raise AddScramError("You must supply 'salt' with 'saltedpassword' to add-scram")
    if components:
        raise AddScramError("Unknown SCRAM configurations: " + ", ".join(sorted(components)))
    if iterations < MIN_ITERATIONS:
        raise AddScramError(f"The 'iterations' value must be >= {MIN_ITERATIONS} for add-scram using "
                            f"{mechanism.mechanism_name}")
    if iterations > MAX_ITERATIONS:
        raise AddScramError(f"The 'iterations' value must be <= {MAX_ITERATIONS} for add-scram using "
                            f"{mechanism.mechanism_name}")
    if salt is None:
        salt = random_bytes(32)
    if salted is None:
        assert password is not None  # one of the two is given (checked above)
        salted = salted_password(mechanism, password, salt, iterations)
    return AddScram(mechanism, name, credential_from_salted_password(mechanism, salt, salted, iterations))


def split_add_scram_list(text: str) -> list[str]:
    """Several `--add-scram` arguments in one properties value, separated by commas or spaces
    outside the brackets: `SCRAM-SHA-256=[name=a,password=x],SCRAM-SHA-512=[name=a,password=x]`."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and (c == "," or c.isspace()):
            if text[start:i].strip():
                out.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def parse_add_scram_list(text: str, random_bytes: RandomBytes) -> list[AddScram]:
    """`oncelog.add.scram`'s value, every argument parsed (AddScramError at the first bad one)."""
    return [parse_add_scram(a, random_bytes) for a in split_add_scram_list(text)]
