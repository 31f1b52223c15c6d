"""Who a connection is: Kafka's principal, a certificate subject as RFC 2253 text, and
`ssl.principal.mapping.rules`.

Kafka names an SSL client by `X500Principal.getName()` of its certificate subject, rewritten by
`SslPrincipalMapper` (KIP-371). ACLs and `super.users` compare that text byte for byte, so the
formatting here follows the JDK's `sun.security.x509.AVA.toRFC2253String` exactly: RDNs last to
first; the members of a multi-valued RDN joined with '+' in the order the certificate stores them;
CN, C, L, ST, O, OU, STREET, DC and UID by keyword, every other attribute as its dotted OID with
the DER encoding of its value in lower-case hex (`1.2.840.113549.1.9.1=#16...` for an e-mail
address); `,=+<>#;"\\` escaped with a backslash anywhere in a value, NUL as `\\00`, leading and
trailing spaces escaped.

`subject_dn_from_der` reads the certificate itself (`SSLObject.getpeercert(binary_form=True)`) and
is exact. `subject_dn_from_peercert` works from `getpeercert()`'s decoded tuples, which lose each
value's ASN.1 string type; it assumes the usual one where the type shows in the output.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

USER_TYPE = "User"


@dataclass(frozen=True)
class KafkaPrincipal:
    """`User:alice`. ACLs, super.users and quotas name principals in this form (`broker` is not
    part of it: ACLs see a broker as `User:<cluster user>`)."""
    type: str
    name: str
    # authenticated with the cluster credential: another broker of the cluster (Kafka's broker
    # principal). Only `broker_principal` sets it; no certificate, SASL user or ACL can.
    broker: bool = False

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """Kafka's `SecurityUtils.parseKafkaPrincipal`: split at the first ':'."""
        kind, sep, name = (text or "").partition(":")
        if not text or not sep:
            raise ValueError(f"expected a string in format principalType:principalName but got {text}")
        return cls(kind, name)

    @classmethod
    def user(cls, name: str) -> KafkaPrincipal:
        return cls(USER_TYPE, name)


ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")


def broker_principal(user: str) -> KafkaPrincipal:
    """The principal of a connection that proved it holds the cluster credential of user `user`."""
    return KafkaPrincipal(USER_TYPE, user, broker=True)

# ------------------------------------------------------------------ RFC 2253 names

_KEYWORDS = {  # the JDK's AVAKeyword entries that are RFC 2253 compliant
    "2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O",
    "2.5.4.11": "OU", "2.5.4.9": "STREET", "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
# ASN.1 string types the JDK prints as text (AVA.isDerString, non-canonical); others go as #hex
_TEXT_TAGS = frozenset({0x13, 0x14, 0x16, 0x1B, 0x1E, 0x0C})  # Printable T61 IA5 General BMP UTF8
_ESCAPED = frozenset(',=+<>#;"\\')

# getpeercert() names attributes by OpenSSL's long names
_LONG_NAMES = {
    "commonName": "2.5.4.3", "countryName": "2.5.4.6", "localityName": "2.5.4.7",
    "stateOrProvinceName": "2.5.4.8", "streetAddress": "2.5.4.9", "organizationName": "2.5.4.10",
    "organizationalUnitName": "2.5.4.11", "domainComponent": "0.9.2342.19200300.100.1.25",
    "userId": "0.9.2342.19200300.100.1.1", "emailAddress": "1.2.840.113549.1.9.1",
    "serialNumber": "2.5.4.5", "title": "2.5.4.12", "surname": "2.5.4.4", "givenName": "2.5.4.42",
    "initials": "2.5.4.43", "generationQualifier": "2.5.4.44", "dnQualifier": "2.5.4.46",
    "pseudonym": "2.5.4.65", "name": "2.5.4.41", "postalCode": "2.5.4.17",
    "businessCategory": "2.5.4.15", "description": "2.5.4.13", "postOfficeBox": "2.5.4.18",
    "jurisdictionCountryName": "1.3.6.1.4.1.311.60.2.1.3",
    "jurisdictionStateOrProvinceName": "1.3.6.1.4.1.311.60.2.1.2",
    "jurisdictionLocalityName": "1.3.6.1.4.1.311.60.2.1.1",
    "organizationIdentifier": "2.5.4.97", "unstructuredName": "1.2.840.113549.1.9.2",
}
# the string type OpenSSL and RFC 5280 use for these; everything else is UTF8String
_USUAL_TAG = {"1.2.840.113549.1.9.1": 0x16, "2.5.4.5": 0x13, "2.5.4.6": 0x13, "2.5.4.46": 0x13,
              "1.3.6.1.4.1.311.60.2.1.3": 0x13}
_DOTTED = re.compile(r"^[0-2](\.[0-9]+)+$")


def _escape_text(value: str) -> str:
    out = []
    for c in value:
        if c in _ESCAPED:
            out.append("\\" + c)
        elif c == "\0":
            out.append("\\00")
        else:
            out.append(c)
    text = "".join(out)
    # like the JDK, leading/trailing ' ' and '\r' are looked for in the already escaped text
    lead = len(text) - len(text.lstrip(" \r"))
    trail = len(text.rstrip(" \r"))
    if lead == 0 and trail == len(text):
        return text
    return "".join("\\" + c if i < lead or i >= trail else c for i, c in enumerate(text))


def _ava(oid: str, tag: int, content: bytes) -> str:
    keyword = _KEYWORDS.get(oid)
    if keyword is None or tag not in _TEXT_TAGS:
        return f"{keyword or oid}=#{_der(tag, content).hex()}"
    # the JDK decodes every text type's bytes as UTF-8 (BMPString included)
    return f"{keyword}={_escape_text(content.decode('utf-8', 'replace'))}"


def _der(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


def format_rdns(rdns: Sequence[Sequence[tuple[str, int, bytes]]]) -> str:
    """RDNs in certificate order, each a list of (oid, string tag, value bytes), as RFC 2253."""
    return ",".join("+".join(_ava(*ava) for ava in rdn) for rdn in reversed(rdns))


def subject_dn_from_peercert(subject: Iterable[Iterable[tuple[str, str]]]) -> str:
    """RFC 2253 text of `getpeercert()["subject"]` (RDN tuples of (long name, value))."""
    rdns = []
    for rdn in subject:
        avas = []
        for name, value in rdn:
            oid = _LONG_NAMES.get(name, name)
            if not _DOTTED.match(oid):
                raise ValueError(f"unknown certificate attribute {name!r}: use subject_dn_from_der")
            avas.append((oid, _USUAL_TAG.get(oid, 0x0C), value.encode()))
        rdns.append(avas)
    return format_rdns(rdns)


# ------------------------------------------------------------------ just enough DER

class _Der:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self) -> tuple[int, bytes]:
        d, p = self.data, self.pos
        if p + 2 > len(d):
            raise ValueError("truncated DER")
        tag, first = d[p], d[p + 1]
        p += 2
        if first < 0x80:
            length = first
        else:
            n = first & 0x7F
            if n == 0 or n > 4 or p + n > len(d):
                raise ValueError("bad DER length")
            length = int.from_bytes(d[p:p + n], "big")
            p += n
        if p + length > len(d):
            raise ValueError("truncated DER")
        self.pos = p + length
        return tag, d[p:p + length]

    def expect(self, tag: int) -> bytes:
        got, content = self.read()
        if got != tag:
            raise ValueError(f"expected DER tag {tag:#x}, got {got:#x}")
        return content

    @property
    def done(self) -> bool:
        return self.pos >= len(self.data)


def _oid(content: bytes) -> str:
    if not content:
        raise ValueError("empty OID")
    parts, value = [], 0
    for b in content:
        value = (value << 7) | (b & 0x7F)
        if not b & 0x80:
            parts.append(value)
            value = 0
    first = parts[0]
    head = [min(first // 40, 2), first - 40 * min(first // 40, 2)]
    return ".".join(str(x) for x in head + parts[1:])


def subject_dn_from_der(cert_der: bytes) -> str:
    """RFC 2253 text of a DER certificate's subject, as Kafka's `X500Principal.getName()`."""
    cert = _Der(_Der(cert_der).expect(0x30))
    tbs = _Der(cert.expect(0x30))
    tag, _ = tbs.read()
    if tag == 0xA0:          # [0] version, then the serial number
        tbs.expect(0x02)
    elif tag != 0x02:
        raise ValueError("not an X.509 certificate")
    for _ in range(3):       # signature algorithm, issuer, validity
        tbs.read()
    name = _Der(tbs.expect(0x30))
    rdns = []
    while not name.done:
        rdn = _Der(name.expect(0x31))
        avas = []
        while not rdn.done:
            ava = _Der(rdn.expect(0x30))
            oid = _oid(ava.expect(0x06))
            tag, value = ava.read()
            avas.append((oid, tag, value))
        rdns.append(avas)
    return format_rdns(rdns)


# ------------------------------------------------------------------ ssl.principal.mapping.rules

# Kafka's SslPrincipalMapper grammar, unchanged (Java and Python read these regexes alike)
_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE)
_BACKREF = re.compile(r"\$(\d+)")
_JAVA_NAMED_GROUP = re.compile(r"\(\?<(?![=!])")


class NoMatchingRule(ValueError):
    """No rule maps this name: Kafka fails the handshake (the connection is closed)."""


def _java_replacement(template: str, m: re.Match[str]) -> str:
    """Java's `Matcher.appendReplacement` syntax: `$n`, `${name}`, `\\x` for a literal x."""
    out, i, groups = [], 0, m.re.groups
    while i < len(template):
        c = template[i]
        if c == "\\" and i + 1 < len(template):
            out.append(template[i + 1])
            i += 2
        elif c == "$":
            i += 1
            if i < len(template) and template[i] == "{":
                end = template.find("}", i)
                if end < 0:
                    raise ValueError("named capturing group is missing trailing '}'")
                out.append(m.group(template[i + 1:end]) or "")
                i = end + 1
                continue
            if i >= len(template) or not template[i].isdigit():
                raise ValueError("Illegal group reference")
            ref = int(template[i])
            if ref > groups:
                raise ValueError(f"No group {ref}")
            i += 1
            while i < len(template) and template[i].isdigit() and ref * 10 + int(template[i]) <= groups:
                ref = ref * 10 + int(template[i])
                i += 1
            out.append(m.group(ref) or "")
        else:
            out.append(c)
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Rule:
    pattern: str | None   # None: DEFAULT
    replacement: str = ""
    case: str = ""        # "L", "U" or ""
    regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def compile(cls, pattern: str, replacement: str, case: str) -> _Rule:
        return cls(pattern, replacement, case, re.compile(_JAVA_NAMED_GROUP.sub("(?P<", pattern)))

    def apply(self, dn: str) -> str | None:
        regex = self.regex
        if regex is None:
            return dn
        if not regex.fullmatch(dn):
            return None
        template = self._literal_backrefs(self.replacement, regex.groups)
        result: str = regex.sub(lambda m: _java_replacement(template, m), dn)
        return result.lower() if self.case == "L" else result.upper() if self.case == "U" else result

    @staticmethod
    def _literal_backrefs(template: str, groups: int) -> str:
        """Kafka's escapeLiteralBackReferences: `$n` beyond the group count is literal text
        (`$123` with 12 groups is `$12` then "3"). Kafka's loop shifts its insert positions after
        the first escape; this escapes each out-of-range reference as it meant to."""
        if groups == 0:
            return template

        def fix(m: re.Match[str]) -> str:
            digits = m.group(1)
            whole: str = m.group(0)
            if digits.startswith("0"):
                return whole
            ref = int(digits)
            while ref > groups and ref >= 10:
                ref //= 10
            return "\\" + whole if ref > groups else whole
        return _BACKREF.sub(fix, template)

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        return f"RULE:{self.pattern}/{self.replacement}" + (f"/{self.case}" if self.case else "")


class SslPrincipalMapper:
    """`ssl.principal.mapping.rules`: comma-separated `RULE:pattern/replacement/[LU]` and
    `DEFAULT` entries; the first rule whose pattern matches the whole name gives the principal
    name. Rules are checked when configured (a bad rule stops the start, as in Kafka)."""

    def __init__(self, rules: Sequence[_Rule]) -> None:
        self.rules = tuple(rules)

    @classmethod
    def from_rules(cls, text: str | None) -> SslPrincipalMapper:
        text = "DEFAULT" if text is None else text
        rules: list[_Rule] = []
        for m in _RULE_SPLITTER.finditer(text.strip()):
            rule = m.group(1)
            parsed = _RULE_PARSER.match(rule)
            if parsed is None or parsed.end() != len(rule):
                rest = rule[parsed.end():] if parsed else rule
                raise ValueError(f"Invalid rule: `{rule}`, unmatched substring: `{rest}`")
            if parsed.group(1) is not None:
                rules.append(_Rule(None))
            elif parsed.group(2) is not None:
                try:
                    rules.append(_Rule.compile(parsed.group(2), parsed.group(4), parsed.group(6)))
                except re.error as e:
                    raise ValueError(f"Invalid rule: `{rule}`: {e}") from None
            # anything else is an empty rule, which Kafka ignores
        return cls(rules)

    def name_for(self, dn: str) -> str:
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise NoMatchingRule(f"No rules apply to {dn}, rules [{', '.join(map(str, self.rules))}]")

    def __str__(self) -> str:
        return f"SslPrincipalMapper(rules = [{', '.join(map(str, self.rules))}])"
