"""The authorizer: Kafka's StandardAuthorizer rules over an index that makes a decision a handful
of dictionary lookups, and the ACL store the controller decides and replays.

Rules (StandardAuthorizerData.authorize / findResult):
1. A principal in `super.users` may do everything (no ACL can deny it).
2. The ACLs that apply to an action on (resource type, name) are those whose pattern is LITERAL
   with that exact name, LITERAL `*`, or PREFIXED with a prefix of the name; whose principal is
   the caller or `User:*`; whose host is `*` or the caller's address.
3. Any matching DENY wins. A DENY matches only its own operation (or ALL).
4. An ALLOW matches its operation, ALL, and what it implies: READ, WRITE, DELETE and ALTER imply
   DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS.
5. Without a matching ACL: if the resource has no ACL at all (for anyone, any operation), the
   answer is `allow.everyone.if.no.acl.found` (default false); otherwise DENY.

Index: ACLs are grouped by (resource type, pattern type, name) and, inside, by principal. A
decision looks up the exact name, `*`, and one entry per distinct PREFIXED length in use for
that resource type, each for the caller and for `User:*`: cost grows with the number of distinct
prefix lengths administrators chose, never with the number of ACLs or with the request.

Hosts compare as addresses: `::1` and Java's `0:0:0:0:0:0:0:1` (what Kafka users write, as
`InetAddress.getHostAddress()` prints it) are the same host.

The store (`Acls.decide_create`, `decide_delete`, `replay`) follows the controller's split:
deciding returns records and per-item results and changes nothing; only `replay` changes state,
on the controller after the records are durable and on every broker that follows them.
"""
from __future__ import annotations

import functools
import ipaddress
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from oncelog.core.security.acl import (
    ACL_RECORD,
    REMOVE_ACL_RECORD,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    acl_record,
    binding_from_record,
    remove_acl_record,
    validate_filter,
    validate_new_binding,
)
from oncelog.core.security.principal import KafkaPrincipal
from oncelog.protocol.errors import ErrorCode

# Kafka's QuorumController.MAX_RECORDS_PER_USER_OP: one request changes at most this many ACLs
MAX_RECORDS_PER_USER_OP = 10000

ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
_IMPLIES_DESCRIBE = frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                               AclOperation.DELETE, AclOperation.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})

# operations reported per resource type in authorized-operations fields (Kafka's AclEntry.supportedOperations)
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
                         AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
                         AclOperation.ALTER_CONFIGS),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE, AclOperation.DESCRIBE_CONFIGS,
                         AclOperation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
                           AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                           AclOperation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE, AclOperation.TWO_PHASE_COMMIT),
    ResourceType.DELEGATION_TOKEN: (AclOperation.DESCRIBE,),
    ResourceType.USER: (AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS),
}
AUTHORIZED_OPERATIONS_OMITTED = -2**31   # the field's value when the client did not ask (KIP-430)


def all_operations(resource_type: ResourceType) -> int:
    """KIP-430's bitfield when no authorizer is configured: every operation the resource type
    supports (Kafka's AuthHelper.authorizedOperations without an authorizer)."""
    bits = 0
    for op in SUPPORTED_OPERATIONS.get(resource_type, ()):
        bits |= 1 << op
    return bits


@functools.lru_cache(maxsize=4096)
def normalize_host(host: str) -> str:
    """A client address as the ACLs' hosts are compared. Cached: every decision asks for the
    caller's (parsing it was half of a decision's cost, which a listing pays once per resource),
    and the addresses are those of the connections, not a request's."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).compressed
    except ValueError:
        return host


def parse_super_users(text: str | None) -> frozenset[str]:
    """`super.users`: principals separated by ';' (`User:admin;User:CN=broker,O=x`)."""
    return frozenset(p.strip() for p in (text or "").split(";") if p.strip())


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: str                      # "SuperUser", "DefaultAllow", "DefaultDeny", or the matching ACL

    def __bool__(self) -> bool:
        return self.allowed


@dataclass(frozen=True)
class _Entry:
    acl_id: str
    binding: AclBinding
    host: str                      # normalised; "*" stays "*"


class Acls:
    """Every ACL, by id, indexed for decisions."""

    def __init__(self) -> None:
        self._by_id: dict[str, AclBinding] = {}
        self._existing: dict[AclBinding, str] = {}
        # (resource type, pattern type, name) -> principal -> entries
        self._index: dict[tuple[ResourceType, PatternType, str], dict[str, list[_Entry]]] = {}
        # resource type -> PREFIXED name length -> how many patterns of that length
        self._prefix_lengths: dict[ResourceType, dict[int, int]] = defaultdict(dict)
        self.version = 0           # bumped by every change (lets callers cache decisions)

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[tuple[str, AclBinding]]:
        return iter(self._by_id.items())

    def bindings(self, f: AclBindingFilter) -> list[AclBinding]:
        """DescribeAcls: every binding the filter matches (Kafka's `acls(filter)`)."""
        return [b for b in self._by_id.values() if f.matches(b)]

    # ------------------------------------------------------------------ lookups for decisions
    def candidates(self, resource_type: ResourceType, name: str,
                   principals: Sequence[str]) -> tuple[bool, list[_Entry]]:
        """(whether any ACL applies to this resource at all, the entries for these principals)."""
        keys = [(resource_type, PatternType.LITERAL, name), (resource_type, PatternType.LITERAL, WILDCARD)]
        for length in self._prefix_lengths.get(resource_type, {}):
            if length <= len(name):
                keys.append((resource_type, PatternType.PREFIXED, name[:length]))
        has_acls = False
        found: list[_Entry] = []
        for key in keys:
            by_principal = self._index.get(key)
            if by_principal:
                has_acls = True
                for p in principals:
                    found.extend(by_principal.get(p, ()))
        return has_acls, found

    def entries_of_type(self, resource_type: ResourceType) -> Iterator[_Entry]:
        for (rtype, _, _), by_principal in self._index.items():
            if rtype is resource_type:
                for entries in by_principal.values():
                    yield from entries

    # ------------------------------------------------------------------ decide (no change)
    def decide_create(self, bindings: Sequence[AclBinding],
                      new_id: Callable[[], str]) -> tuple[list[dict[str, Any]], list[tuple[ErrorCode, str | None]]]:
        """CreateAcls: (records, one (error code, message) per binding). A binding that exists
        already succeeds without a record, as in Kafka."""
        records: list[dict[str, Any]] = []
        results: list[tuple[ErrorCode, str | None]] = []
        added: set[AclBinding] = set()
        for b in bindings:
            problem = validate_new_binding(b)
            if problem:
                results.append((ErrorCode.INVALID_REQUEST, problem))
                continue
            if b not in self._existing and b not in added:
                if len(records) >= MAX_RECORDS_PER_USER_OP:
                    results.append((ErrorCode.INVALID_REQUEST,
                                    f"Cannot create more than {MAX_RECORDS_PER_USER_OP} acls in a single request"))
                    continue
                acl_id = new_id()
                while acl_id in self._by_id:
                    acl_id = new_id()
                records.append(acl_record(acl_id, b))
                added.add(b)
            results.append((ErrorCode.NONE, None))
        return records, results

    def decide_delete(self, filters: Sequence[AclBindingFilter]) -> tuple[
            list[dict[str, Any]], list[tuple[ErrorCode, str | None, list[AclBinding]]]]:
        """DeleteAcls: (records, per filter (error code, message, deleted bindings)). A filter
        that matches nothing succeeds with nothing deleted; more than MAX_RECORDS_PER_USER_OP
        deletions in one request fail that filter (Kafka's BoundedListTooLongException)."""
        records: list[dict[str, Any]] = []
        removed: set[str] = set()
        results: list[tuple[ErrorCode, str | None, list[AclBinding]]] = []
        for f in filters:
            problem = validate_filter(f)
            if problem:
                results.append((ErrorCode.INVALID_REQUEST, problem, []))
                continue
            matched = [(i, b) for i, b in self._by_id.items() if f.matches(b)]
            new = [i for i, _ in matched if i not in removed]
            if len(removed) + len(new) > MAX_RECORDS_PER_USER_OP:
                results.append((ErrorCode.UNKNOWN_SERVER_ERROR,
                                f"Cannot remove more than {MAX_RECORDS_PER_USER_OP} acls in a single delete "
                                "operation.", []))
                continue
            for i in new:
                removed.add(i)
                records.append(remove_acl_record(i))
            results.append((ErrorCode.NONE, None, [b for _, b in matched]))
        return records, results

    # ------------------------------------------------------------------ the only changes
    def replay(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == ACL_RECORD:
            acl_id, binding = binding_from_record(record)
            if acl_id in self._by_id:
                self._remove(acl_id)
            self._add(acl_id, binding)
        elif kind == REMOVE_ACL_RECORD:
            acl_id = str(record.get("id"))
            if acl_id not in self._by_id:
                raise ValueError(f"Unable to replay {record!r}: no acl with that ID found.")
            self._remove(acl_id)
        else:
            raise ValueError(f"not an ACL record: {kind!r}")
        self.version += 1

    def _add(self, acl_id: str, b: AclBinding) -> None:
        p = b.pattern
        self._by_id[acl_id] = b
        self._existing[b] = acl_id
        entry = _Entry(acl_id, b, b.entry.host if b.entry.host == WILDCARD else normalize_host(b.entry.host))
        self._index.setdefault((p.resource_type, p.pattern_type, p.name), {}) \
            .setdefault(b.entry.principal, []).append(entry)
        if p.pattern_type is PatternType.PREFIXED:
            lengths = self._prefix_lengths[p.resource_type]
            lengths[len(p.name)] = lengths.get(len(p.name), 0) + 1

    def _remove(self, acl_id: str) -> None:
        b = self._by_id.pop(acl_id)
        if self._existing.get(b) == acl_id:
            del self._existing[b]
        p = b.pattern
        key = (p.resource_type, p.pattern_type, p.name)
        by_principal = self._index[key]
        entries = [e for e in by_principal[b.entry.principal] if e.acl_id != acl_id]
        if entries:
            by_principal[b.entry.principal] = entries
        else:
            del by_principal[b.entry.principal]
            if not by_principal:
                del self._index[key]
        if p.pattern_type is PatternType.PREFIXED:
            lengths = self._prefix_lengths[p.resource_type]
            lengths[len(p.name)] -= 1
            if not lengths[len(p.name)]:
                del lengths[len(p.name)]

    # ------------------------------------------------------------------ snapshots
    def to_snapshot(self) -> list[dict[str, Any]]:
        return [acl_record(i, b) for i, b in sorted(self._by_id.items())]

    @classmethod
    def from_snapshot(cls, records: Iterable[dict[str, Any]]) -> Acls:
        acls = cls()
        for r in records:
            acls.replay(r)
        return acls


def _ace_result(entry: _Entry, operation: AclOperation, host: str) -> AclPermissionType | None:
    """Kafka's findResult for an ACL already known to apply to the resource and principal."""
    if entry.host != WILDCARD and entry.host != host:
        return None
    acl_op, permission = entry.binding.entry.operation, entry.binding.entry.permission_type
    if acl_op is not AclOperation.ALL:
        if permission is ALLOW:
            if operation is AclOperation.DESCRIBE:
                if acl_op not in _IMPLIES_DESCRIBE:
                    return None
            elif operation is AclOperation.DESCRIBE_CONFIGS:
                if acl_op not in _IMPLIES_DESCRIBE_CONFIGS:
                    return None
            elif operation is not acl_op:
                return None
        elif operation is not acl_op:
            return None
    return permission


class Authorizer:
    """Decisions over `acls`, which the caller keeps current by replaying records into it."""

    def __init__(self, acls: Acls | None = None, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.acls = acls if acls is not None else Acls()
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found

    def is_super_user(self, principal: KafkaPrincipal) -> bool:
        return str(principal) in self.super_users

    def decide(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
               resource_type: ResourceType, name: str) -> Decision:
        if self.is_super_user(principal):
            return Decision(True, "SuperUser")
        host = normalize_host(host)
        has_acls, entries = self.acls.candidates(resource_type, name, (str(principal), WILDCARD_PRINCIPAL))
        allow = None
        for entry in entries:
            result = _ace_result(entry, operation, host)
            if result is DENY:
                return Decision(False, f"MatchingAcl(acl={entry.binding})")
            if result is ALLOW and allow is None:
                allow = entry
        if allow is not None:
            return Decision(True, f"MatchingAcl(acl={allow.binding})")
        if not has_acls:
            return Decision(self.allow_everyone_if_no_acl_found,
                            "DefaultAllow" if self.allow_everyone_if_no_acl_found else "DefaultDeny")
        return Decision(False, "DefaultDeny")

    def authorize(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        return self.decide(principal, host, operation, resource_type, name).allowed

    def authorized_operations(self, principal: KafkaPrincipal, host: str, resource_type: ResourceType,
                              name: str) -> int:
        """KIP-430's bitfield: OR of 1 << op over the operations the caller may perform."""
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(resource_type, ()):
            if self.authorize(principal, host, op, resource_type, name):
                bits |= 1 << op
        return bits

    def authorize_by_resource_type(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        """May the caller perform `operation` on at least one resource of this type? Kafka's
        `Authorizer.authorizeByResourceType` (KIP-679: an idempotent producer needs
        IDEMPOTENT_WRITE on the cluster or WRITE on some topic). Implied operations do not count."""
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True
        host = normalize_host(host)
        caller = str(principal)
        deny_literal: set[str] = set()
        deny_prefix: set[str] = set()
        allow_literal: set[str] = set()
        allow_prefix: set[str] = set()
        wildcard_allow = False
        for entry in self.acls.entries_of_type(resource_type):
            ace, pattern = entry.binding.entry, entry.binding.pattern
            if entry.host not in (WILDCARD, host):
                continue
            if ace.principal not in (caller, WILDCARD_PRINCIPAL):
                continue
            if ace.operation not in (operation, AclOperation.ALL):
                continue
            literal = pattern.pattern_type is PatternType.LITERAL
            if ace.permission_type is DENY:
                if literal and pattern.name == WILDCARD:
                    return False
                (deny_literal if literal else deny_prefix).add(pattern.name)
            elif literal and pattern.name == WILDCARD:
                wildcard_allow = True
            else:
                (allow_literal if literal else allow_prefix).add(pattern.name)
        if wildcard_allow:
            return True
        for literal, names in ((True, allow_literal), (False, allow_prefix)):
            for name in names:
                if literal and name in deny_literal:
                    continue
                if not any(name[:i] in deny_prefix for i in range(1, len(name) + 1)):
                    return True
        return False
