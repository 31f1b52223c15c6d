"""`oncelog acl`: create, list and delete ACLs (kafka-acls.sh, `rpk security acl`). The broker
must run an authorizer (`authorizer.class.name`); the caller needs ALTER on the cluster to change
ACLs and DESCRIBE to list them.

A resource is named by --topic, --group, --transactional-id, --cluster, --user, or --resource-type
with --resource-name; --resource-pattern-type literal (default) or prefixed. Principals are
Kafka's `User:NAME` (a bare NAME means User:NAME); hosts default to * (any)."""
from __future__ import annotations

import click

from oncelog.cli.connect import (
    USAGE,
    CommandError,
    Target,
    admin_client,
    connection_options,
    format_option,
    print_json,
    print_table,
    run,
)

_TYPE_NAMES = {"topic": "TOPIC", "group": "GROUP", "cluster": "CLUSTER", "transactional-id": "TRANSACTIONAL_ID",
               "transactional_id": "TRANSACTIONAL_ID", "user": "USER", "delegation-token": "DELEGATION_TOKEN",
               "delegation_token": "DELEGATION_TOKEN", "any": "ANY"}


def _enum(enum, value: str, what: str, allowed: list[str]):
    try:
        return enum[value.strip().upper().replace("-", "_")]
    except KeyError:
        raise CommandError(f"unknown {what} {value!r} ({', '.join(allowed)})", USAGE) from None


def _operation(value: str):
    from oncelog.core.security.acl import AclOperation
    names = [o.name.lower() for o in AclOperation if o.name not in ("UNKNOWN", "ANY")]
    return _enum(AclOperation, value, "operation", names)


def _principal(value: str) -> str:
    return value if ":" in value else f"User:{value}"


def resource_options(f):
    for option in reversed([
        click.option("--topic", help="A topic (or, with --resource-pattern-type prefixed, a name prefix)."),
        click.option("--group", help="A consumer group."),
        click.option("--transactional-id", help="A transactional id."),
        click.option("--cluster", is_flag=True, help="The cluster (kafka-cluster)."),
        click.option("--user", "user_resource", help="A user, as a resource (delegation tokens, quotas)."),
        click.option("--resource-type", help="Any resource type by name: topic, group, cluster, transactional-id, "
                     "user, delegation-token (with --resource-name)."),
        click.option("--resource-name", help="The resource's name, with --resource-type."),
        click.option("--resource-pattern-type", default=None,
                     help="literal (default when creating), prefixed; match or any when listing/deleting."),
    ]):
        f = option(f)
    return f


def _resource(topic, group, transactional_id, cluster, user_resource, resource_type, resource_name,
              creating: bool):
    """(ResourceType, name or None) from the resource options; ANY with no name when none given
    and not creating."""
    from oncelog.core.security.acl import CLUSTER_NAME, ResourceType
    given = [(t, n) for t, n in (("TOPIC", topic), ("GROUP", group), ("TRANSACTIONAL_ID", transactional_id),
                                 ("CLUSTER", CLUSTER_NAME if cluster else None), ("USER", user_resource))
             if n is not None]
    if resource_type is not None:
        kind = _TYPE_NAMES.get(resource_type.strip().lower())
        if kind is None:
            raise CommandError(f"unknown resource type {resource_type!r} (topic, group, cluster, transactional-id, "
                               "user, delegation-token)", USAGE)
        given.append((kind, resource_name if kind != "CLUSTER" else resource_name or CLUSTER_NAME))
    elif resource_name is not None:
        raise CommandError("--resource-name needs --resource-type", USAGE)
    if len(given) > 1:
        raise CommandError("name one resource (--topic, --group, --transactional-id, --cluster, --user or "
                           "--resource-type)", USAGE)
    if not given:
        if creating:
            raise CommandError("name the resource: --topic, --group, --transactional-id, --cluster, --user or "
                               "--resource-type", USAGE)
        return ResourceType.ANY, None
    kind, name = given[0]
    if creating and not name:
        raise CommandError(f"a {kind.lower()} ACL needs a resource name", USAGE)
    return ResourceType[kind], name


def _pattern_type(value: str | None, creating: bool):
    from oncelog.core.security.acl import PatternType
    if value is None:
        return PatternType.LITERAL if creating else PatternType.ANY
    allowed = ["literal", "prefixed"] + ([] if creating else ["match", "any"])
    p = _enum(PatternType, value, "resource pattern type", allowed)
    if p.name.lower() not in allowed:
        raise CommandError(f"resource pattern type {value!r}: one of {', '.join(allowed)}", USAGE)
    return p


def _row(b) -> dict:
    return {"resource_type": b.pattern.resource_type.name, "resource_name": b.pattern.name,
            "pattern_type": b.pattern.pattern_type.name, "principal": b.entry.principal, "host": b.entry.host,
            "operation": b.entry.operation.name, "permission": b.entry.permission_type.name}


def _show(bindings, fmt: str) -> None:
    rows = [_row(b) for b in bindings]
    if fmt == "json":
        print_json(rows)
        return
    print_table(["PRINCIPAL", "HOST", "RESOURCE-TYPE", "RESOURCE-NAME", "PATTERN", "OPERATION", "PERMISSION"],
                [[r["principal"], r["host"], r["resource_type"], r["resource_name"], r["pattern_type"], r["operation"],
                  r["permission"]] for r in rows])


@click.group("acl")
def acl() -> None:
    """Create, list and delete ACLs."""


@acl.command("create")
@click.option("--allow-principal", "allow", multiple=True, metavar="User:NAME", help="Allow this principal.")
@click.option("--deny-principal", "deny", multiple=True, metavar="User:NAME", help="Deny this principal.")
@click.option("--operation", "operations", multiple=True, required=True,
              help="read, write, create, delete, alter, describe, cluster_action, describe_configs, "
              "alter_configs, idempotent_write, all (repeatable).")
@click.option("--host", "hosts", multiple=True, help="Only from this address (repeatable; default any).")
@resource_options
@connection_options
def create(allow, deny, operations, hosts, topic, group, transactional_id, cluster, user_resource, resource_type,
           resource_name, resource_pattern_type, target: Target) -> None:
    """Create ACLs: each principal x operation x host on one resource."""
    from oncelog.core.security.acl import AccessControlEntry, AclBinding, AclPermissionType, ResourcePattern
    if not allow and not deny:
        raise CommandError("give --allow-principal or --deny-principal", USAGE)
    kind, name = _resource(topic, group, transactional_id, cluster, user_resource, resource_type, resource_name, True)
    pattern = ResourcePattern(kind, name, _pattern_type(resource_pattern_type, True))
    ops = [_operation(o) for o in operations]
    bindings = [AclBinding(pattern, AccessControlEntry(_principal(p), h, op, permission))
                for principals, permission in ((allow, AclPermissionType.ALLOW), (deny, AclPermissionType.DENY))
                for p in principals for op in ops for h in (hosts or ("*",))]

    async def go():
        async with admin_client(target) as admin:
            await admin.create_acls(bindings)
    run(target, go())
    _show(bindings, "text")


def _filter(principal, host, operation, permission, topic, group, transactional_id, cluster, user_resource,
            resource_type, resource_name, resource_pattern_type):
    from oncelog.core.security.acl import (
        AccessControlEntryFilter,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternFilter,
    )
    kind, name = _resource(topic, group, transactional_id, cluster, user_resource, resource_type, resource_name,
                           False)
    return AclBindingFilter(
        ResourcePatternFilter(kind, name, _pattern_type(resource_pattern_type, False)),
        AccessControlEntryFilter(_principal(principal) if principal else None, host,
                                 _operation(operation) if operation else AclOperation.ANY,
                                 _enum(AclPermissionType, permission, "permission", ["allow", "deny"])
                                 if permission else AclPermissionType.ANY))


def filter_options(f):
    for option in reversed([
        click.option("--principal", help="Only ACLs of this principal."),
        click.option("--host", help="Only ACLs for this host."),
        click.option("--operation", help="Only ACLs of this operation."),
        click.option("--permission", help="allow or deny."),
    ]):
        f = option(f)
    return resource_options(f)


@acl.command("list")
@filter_options
@format_option
@connection_options
def list_(principal, host, operation, permission, topic, group, transactional_id, cluster, user_resource,
          resource_type, resource_name, resource_pattern_type, fmt, target: Target) -> None:
    """The ACLs that match the filters (all without any)."""
    f = _filter(principal, host, operation, permission, topic, group, transactional_id, cluster, user_resource,
                resource_type, resource_name, resource_pattern_type)

    async def go():
        async with admin_client(target) as admin:
            return await admin.describe_acls(f)
    _show(run(target, go()), fmt)


@acl.command("delete")
@filter_options
@click.option("--all", "everything", is_flag=True, help="Allow a delete without any filter (every ACL).")
@format_option
@connection_options
def delete(principal, host, operation, permission, topic, group, transactional_id, cluster, user_resource,
           resource_type, resource_name, resource_pattern_type, everything, fmt, target: Target) -> None:
    """Delete the ACLs that match the filters; prints those deleted."""
    if not everything and not any((principal, host, operation, permission, topic, group, transactional_id, cluster,
                                   user_resource, resource_type)):
        raise CommandError("no filter: give one (--principal, --topic, ...) or --all to delete every ACL", USAGE)
    f = _filter(principal, host, operation, permission, topic, group, transactional_id, cluster, user_resource,
                resource_type, resource_name, resource_pattern_type)

    async def go():
        async with admin_client(target) as admin:
            return await admin.delete_acls([f])
    _show(run(target, go()), fmt)
