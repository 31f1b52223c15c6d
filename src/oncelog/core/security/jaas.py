"""Kafka's `sasl.jaas.config` values: `<LoginModule> <flag> (<name>=<value>)*;`, read the way
Kafka reads them (`JaasConfig`, a `java.io.StreamTokenizer` with `-`, `_`, `$` as word
characters and `//`, `/* */` comments).

What oncelog takes from them:
- a PLAIN listener's users, `user_<name>="<password>"` options of
  `org.apache.kafka.common.security.plain.PlainLoginModule`
  (`listener.name.<listener>.plain.sasl.jaas.config`);
- the client side of a link (`username`/`password` of `PlainLoginModule` or `ScramLoginModule`),
  for brokers reaching the controller over SASL.

Tokenizer quirks kept on purpose, so that a value that fails in Kafka fails here too: an unquoted
value starting with a digit, `.` or `-` is a number, which Kafka refuses ("Value not specified");
a quoted string ends at the closing quote or at the end of the line.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
CONTROL_FLAGS = ("REQUIRED", "REQUISITE", "SUFFICIENT", "OPTIONAL")
_USER_PREFIX = "user_"


class JaasConfigError(ValueError):
    """The value does not parse; Kafka refuses to start with it, and so do we."""


@dataclass(frozen=True)
class LoginModuleEntry:
    login_module: str
    control_flag: str                      # one of CONTROL_FLAGS
    options: Mapping[str, str] = field(default_factory=dict)


# token kinds
_WORD, _NUMBER, _QUOTED, _EOF = "word", "number", "quoted", "eof"
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _is_alpha(c: str) -> bool:
    o = ord(c)
    return c.isascii() and c.isalpha() or 160 <= o <= 255 or o >= 256 or c in "-_$"


def _is_digit(c: str) -> bool:
    return c in "0123456789.-"


def _tokens(text: str) -> Iterator[tuple[str, str | None]]:
    """(kind, text): words and quoted strings carry text; numbers and single characters don't
    (Java's `sval` is null for them); a single character comes as (that character, None)."""
    i, n = 0, len(text)
    while True:
        while i < n and ord(text[i]) <= 32:
            i += 1
        if i >= n:
            yield _EOF, None
            return
        c = text[i]
        if _is_digit(c):  # StreamTokenizer looks for numbers before words
            j = i
            if c == "-":
                if i + 1 >= n or not (text[i + 1] == "." or text[i + 1].isdigit()):
                    yield "-", None
                    i += 1
                    continue
                j += 1
            seen_dot = False
            while j < n and (text[j].isdigit() or (text[j] == "." and not seen_dot)):
                seen_dot = seen_dot or text[j] == "."
                j += 1
            yield _NUMBER, None
            i = j
        elif _is_alpha(c):
            j = i + 1
            while j < n and (_is_alpha(text[j]) or _is_digit(text[j])):
                j += 1
            yield _WORD, text[i:j]
            i = j
        elif c in "\"'":
            out, j = [], i + 1
            while j < n and text[j] not in (c, "\n", "\r"):
                if text[j] == "\\" and j + 1 < n:
                    j += 1
                    e = text[j]
                    if e in "01234567":
                        digits = e
                        limit = 3 if e <= "3" else 2
                        while len(digits) < limit and j + 1 < n and text[j + 1] in "01234567":
                            j += 1
                            digits += text[j]
                        out.append(chr(int(digits, 8)))
                    else:
                        out.append(_ESCAPES.get(e, e))
                else:
                    out.append(text[j])
                j += 1
            yield _QUOTED, "".join(out)
            i = j + 1 if j < n and text[j] == c else j
        elif c == "/":
            if text.startswith("/*", i):
                end = text.find("*/", i + 2)
                i = n if end < 0 else end + 2
            else:  # "//" and a lone "/" (the default comment character) both end at the line's end
                while i < n and text[i] not in "\r\n":
                    i += 1
        else:
            yield c, None
            i += 1


def parse_jaas_config(text: str) -> list[LoginModuleEntry]:
    """Every login module entry in the value, in order."""
    tokens = _tokens(text)
    entries: list[LoginModuleEntry] = []
    while True:
        kind, value = next(tokens)
        if kind == _EOF:
            break
        if value is None:
            raise JaasConfigError("Login module not specified in JAAS config")
        module = value
        kind, flag = next(tokens)
        if kind == _EOF:
            raise JaasConfigError("Login module control flag not specified in JAAS config")
        if flag is None:
            raise JaasConfigError("Login module control flag is not available in the JAAS config")
        if flag.upper() not in CONTROL_FLAGS:
            raise JaasConfigError(f"Invalid login module control flag '{flag}' in JAAS config")
        options: dict[str, str] = {}
        while True:
            kind, key = next(tokens)
            if kind in (_EOF, ";"):
                break
            eq, _ = next(tokens)
            vkind, val = next(tokens) if eq == "=" else (_EOF, None)
            if eq != "=" or vkind == _EOF or val is None or key is None:
                raise JaasConfigError(f"Value not specified for key '{key}' in JAAS config")
            options[key] = val
        if kind != ";":
            raise JaasConfigError("JAAS config entry not terminated by semi-colon")
        entries.append(LoginModuleEntry(module, flag.upper(), options))
    if not entries:
        raise JaasConfigError("Login module not specified in JAAS config")
    return entries


def parse_sasl_jaas_config(text: str) -> LoginModuleEntry:
    """A `sasl.jaas.config` property, which Kafka requires to hold exactly one login module."""
    entries = parse_jaas_config(text)
    if len(entries) != 1:
        raise JaasConfigError(f"JAAS config property contains {len(entries)} login modules, should be 1 module")
    return entries[0]


def plain_users(entries: list[LoginModuleEntry] | LoginModuleEntry) -> dict[str, str]:
    """`user_<name>` options of the PlainLoginModule entries: name -> password. Kafka reads only
    entries of that class (PlainServerCallbackHandler), so users under another module are none."""
    if isinstance(entries, LoginModuleEntry):
        entries = [entries]
    users: dict[str, str] = {}
    for entry in entries:
        if entry.login_module != PLAIN_LOGIN_MODULE:
            continue
        for key, value in entry.options.items():
            if key.startswith(_USER_PREFIX):
                users.setdefault(key[len(_USER_PREFIX):], value)
    return users


def client_credentials(entry: LoginModuleEntry) -> tuple[str, str]:
    """(username, password) of a Plain/Scram login module, for the client end of a link."""
    if entry.login_module not in (PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE):
        raise JaasConfigError(f"{entry.login_module} is not a PLAIN or SCRAM login module")
    try:
        return entry.options["username"], entry.options["password"]
    except KeyError as e:
        raise JaasConfigError(f"{entry.login_module} needs {e.args[0]}=\"...\"") from None
