"""`oncelog quota`: client quotas, as `rpk cluster quotas describe|alter` and `kafka-configs
--entity-type users|clients|ips` show and change them (DescribeClientQuotas, AlterClientQuotas).
An entity is named `--name TYPE=NAME` (TYPE user, client-id or ip; repeatable, for a user and
client-id pair) or `--default TYPE` (that type's default entity)."""
from __future__ import annotations

import click

from oncelog.cli.connect import (
    USAGE,
    CommandError,
    Target,
    admin_client,
    connection_options,
    format_option,
    parse_assignments,
    print_json,
    print_table,
    run,
)

TYPES = ("user", "client-id", "ip")


def _entity(names: tuple[str, ...], defaults: tuple[str, ...]) -> dict[str, str | None]:
    entity: dict[str, str | None] = dict(parse_assignments(names, "--name"))
    for t in defaults:
        entity[t] = None
    bad = sorted(t for t in entity if t not in TYPES)
    if bad:
        raise CommandError(f"entity type {bad[0]!r}: one of {', '.join(TYPES)}", USAGE)
    return entity


@click.group("quota")
def quota() -> None:
    """Client quotas (byte rates, request percentage, connection rates) per user, client id or ip."""


@quota.command("describe")
@click.option("--name", "names", multiple=True, metavar="TYPE=NAME", help="Only this entity (repeatable).")
@click.option("--default", "defaults", multiple=True, type=click.Choice(TYPES), help="This type's default entity.")
@format_option
@connection_options
def describe(names, defaults, fmt, target: Target) -> None:
    """Quotas of the matching entities (every entity with a quota when none is named)."""
    entity = _entity(names, defaults)

    async def go():
        async with admin_client(target) as admin:
            return await admin.describe_client_quotas(entity)
    found = run(target, go())
    if fmt == "json":
        print_json(found)
        return
    print_table(["ENTITY", "QUOTA", "VALUE"],
                [[_show(q["entity"]), k, v] for q in found for k, v in sorted(q["values"].items())])


def _show(entity: dict[str, str | None]) -> str:
    return ",".join(f"{t}={'<default>' if n is None else n}" for t, n in sorted(entity.items()))


@quota.command("alter")
@click.option("--name", "names", multiple=True, metavar="TYPE=NAME", help="The entity (repeatable).")
@click.option("--default", "defaults", multiple=True, type=click.Choice(TYPES), help="This type's default entity.")
@click.option("--add", "adds", multiple=True, metavar="KEY=VALUE",
              help="Set a quota: producer_byte_rate, consumer_byte_rate, request_percentage, "
              "controller_mutation_rate, connection_creation_rate (repeatable).")
@click.option("--delete", "deletes", multiple=True, metavar="KEY", help="Remove a quota (repeatable).")
@connection_options
def alter(names, defaults, adds, deletes, target: Target) -> None:
    """Set or remove quotas of one entity."""
    entity = _entity(names, defaults)
    if not entity:
        raise CommandError("name the entity: --name TYPE=NAME or --default TYPE", USAGE)
    values: dict[str, float] = {}
    for k, v in parse_assignments(adds, "--add").items():
        try:
            values[k] = float(v)
        except ValueError:
            raise CommandError(f"--add {k}={v}: the value is not a number", USAGE) from None
    if not values and not deletes:
        raise CommandError("nothing to change: give --add KEY=VALUE or --delete KEY", USAGE)

    async def go():
        async with admin_client(target) as admin:
            await admin.alter_client_quotas(entity, values, list(deletes))
    run(target, go())
    click.echo(f"altered the quotas of {_show(entity)}")
