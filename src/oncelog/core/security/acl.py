"""ACLs as Kafka defines them: bindings, the filters of DescribeAcls/DeleteAcls, validation, and
their records in the controller's metadata log.

A binding is (resource pattern, entry): `TOPIC:LITERAL:orders` with `User:alice from * READ
ALLOW`. Enum values are the wire codes (int8). Unknown codes read off the wire become UNKNOWN, as
Kafka's `fromCode` does; requests that carry one are refused whole (Kafka fails their parse).

Filter semantics (`AclBindingFilter.matches`): a None name, principal or host matches anything;
pattern type ANY matches any pattern type but needs the exact name; MATCH matches what an action
on that name would consult: the LITERAL name, the LITERAL wildcard `*`, and PREFIXED patterns
the name starts with. Principal and host compare as text (`User:*` in a filter means only ACLs
for `User:*`).

Records (JSON objects in the metadata log, field names from Kafka's AccessControlEntryRecord):
    {"type": "acl", "id": str, "resource_type": int, "resource_name": str, "pattern_type": int,
     "principal": str, "host": str, "operation": int, "permission_type": int}
    {"type": "remove_acl", "id": str}
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeVar

from oncelog.core.security.principal import KafkaPrincipal

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"
ACL_RECORD, REMOVE_ACL_RECORD = "acl", "remove_acl"
UNKNOWN_CODE = 0                 # every ACL enum's UNKNOWN


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15   # KIP-939: InitProducerId with Enable2Pc needs it beside WRITE


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


E = TypeVar("E", bound=IntEnum)


def from_code(enum: type[E], code: int) -> E:
    """Kafka's `fromCode`: a code the enum lacks is UNKNOWN."""
    member = enum._value2member_map_.get(code)
    return member if member is not None else enum(0)  # type: ignore[return-value]


# ------------------------------------------------------------------ bindings

@dataclass(frozen=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL

    def __str__(self) -> str:
        return f"{self.resource_type.name}:{self.pattern_type.name}:{self.name}"


@dataclass(frozen=True)
class AccessControlEntry:
    principal: str          # "User:alice", "User:*"
    host: str               # an IP address or "*"
    operation: AclOperation
    permission_type: AclPermissionType


@dataclass(frozen=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    def is_unknown(self) -> bool:
        """Kafka's AclBinding.isUnknown: a code its enums do not have (requests carrying one fail
        their parse)."""
        p, e = self.pattern, self.entry
        return UNKNOWN_CODE in (p.resource_type, p.pattern_type, e.operation, e.permission_type)

    def __str__(self) -> str:
        e = self.entry
        return (f"(pattern={self.pattern}, principal={e.principal}, host={e.host}, "
                f"operation={e.operation.name}, permission={e.permission_type.name})")


def validate_new_binding(binding: AclBinding) -> str | None:
    """Why CreateAcls refuses this binding with INVALID_REQUEST, or None. Kafka's checks
    (AclControlManager.validateNewAcl, AclApis.handleCreateAcls) plus the principal's form."""
    p, e = binding.pattern, binding.entry
    if p.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {p.resource_type.name}"
    if p.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {p.pattern_type.name}"
    if e.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return f"Invalid operation {e.operation.name}"
    if e.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        return f"Invalid permissionType {e.permission_type.name}"
    if p.resource_type is ResourceType.CLUSTER and p.name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not p.name:
        return "Resource name should not be empty"
    try:
        KafkaPrincipal.parse(e.principal)
    except ValueError as err:
        return str(err)
    if not e.host:
        return "Host should not be empty"
    return None


# ------------------------------------------------------------------ filters

@dataclass(frozen=True)
class ResourcePatternFilter:
    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY

    def is_unknown(self) -> bool:
        return self.resource_type is ResourceType.UNKNOWN or self.pattern_type is PatternType.UNKNOWN

    def matches(self, pattern: ResourcePattern) -> bool:
        if self.resource_type is not ResourceType.ANY and self.resource_type is not pattern.resource_type:
            return False
        if (self.pattern_type not in (PatternType.ANY, PatternType.MATCH)
                and self.pattern_type is not pattern.pattern_type):
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, pattern.pattern_type):
            return self.name == pattern.name
        if pattern.pattern_type is PatternType.LITERAL:     # MATCH from here on
            return self.name == pattern.name or pattern.name == WILDCARD
        return self.name.startswith(pattern.name)           # PREFIXED


@dataclass(frozen=True)
class AccessControlEntryFilter:
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def is_unknown(self) -> bool:
        return self.operation is AclOperation.UNKNOWN or self.permission_type is AclPermissionType.UNKNOWN

    def matches(self, entry: AccessControlEntry) -> bool:
        return ((self.principal is None or self.principal == entry.principal)
                and (self.host is None or self.host == entry.host)
                and (self.operation is AclOperation.ANY or self.operation is entry.operation)
                and (self.permission_type is AclPermissionType.ANY or self.permission_type is entry.permission_type))


@dataclass(frozen=True)
class AclBindingFilter:
    pattern: ResourcePatternFilter = ResourcePatternFilter()
    entry: AccessControlEntryFilter = AccessControlEntryFilter()

    def matches(self, binding: AclBinding) -> bool:
        return self.pattern.matches(binding.pattern) and self.entry.matches(binding.entry)


ANY_FILTER = AclBindingFilter()


def validate_filter(f: AclBindingFilter) -> str | None:
    """Why DescribeAcls/DeleteAcls refuse this filter with INVALID_REQUEST, or None."""
    if f.pattern.is_unknown():
        return "Unknown patternFilter."
    if f.entry.is_unknown():
        return "Unknown entryFilter."
    return None


# ------------------------------------------------------------------ from requests

def binding_from_wire(c: Any) -> AclBinding:
    """CreateAcls' AclCreation as a binding; unknown
    enum codes become UNKNOWN, which validation refuses with INVALID_REQUEST."""
    return AclBinding(
        ResourcePattern(from_code(ResourceType, int(c.resource_type)), str(c.resource_name),
                        from_code(PatternType, int(c.resource_pattern_type))),
        AccessControlEntry(str(c.principal), str(c.host), from_code(AclOperation, int(c.operation)),
                           from_code(AclPermissionType, int(c.permission_type))))


def filter_from_wire(f: Any) -> AclBindingFilter:
    """A DescribeAcls request or DeleteAcls filter as Kafka's AclBindingFilter."""
    return AclBindingFilter(
        ResourcePatternFilter(from_code(ResourceType, int(f.resource_type_filter)), f.resource_name_filter,
                              from_code(PatternType, int(f.pattern_type_filter))),
        AccessControlEntryFilter(f.principal_filter, f.host_filter, from_code(AclOperation, int(f.operation)),
                                 from_code(AclPermissionType, int(f.permission_type))))


# ------------------------------------------------------------------ records

def acl_record(acl_id: str, b: AclBinding) -> dict[str, Any]:
    p, e = b.pattern, b.entry
    return {"type": ACL_RECORD, "id": acl_id, "resource_type": int(p.resource_type),
            "resource_name": p.name, "pattern_type": int(p.pattern_type), "principal": e.principal,
            "host": e.host, "operation": int(e.operation), "permission_type": int(e.permission_type)}


def remove_acl_record(acl_id: str) -> dict[str, Any]:
    return {"type": REMOVE_ACL_RECORD, "id": acl_id}


def binding_from_record(r: dict[str, Any]) -> tuple[str, AclBinding]:
    """(id, binding) of an `acl` record; ValueError for one that replay must not apply."""
    try:
        binding = AclBinding(
            ResourcePattern(ResourceType(r["resource_type"]), str(r["resource_name"]),
                            PatternType(r["pattern_type"])),
            AccessControlEntry(str(r["principal"]), str(r["host"]), AclOperation(r["operation"]),
                               AclPermissionType(r["permission_type"])))
        acl_id = str(r["id"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"bad acl record {r!r}: {e}") from None
    problem = validate_new_binding(binding)
    if problem:
        raise ValueError(f"bad acl record {r!r}: {problem}")
    return acl_id, binding
