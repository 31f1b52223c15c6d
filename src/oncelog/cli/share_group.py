"""`oncelog share-group`: share groups (KIP-932) as kafka-share-groups.sh shows them: list, describe
(state, epochs, members with their epochs and the partitions they share), delete (an empty share
group, with its share-partitions' state). The same groups appear in `oncelog group list` with
type `share`."""
from __future__ import annotations

import click

from oncelog.cli.connect import Target, admin_client, connection_options, format_option, print_json, print_table, run
from oncelog.cli.group import delete as group_delete
from oncelog.cli.group import describe as group_describe


@click.group("share-group")
def share_group() -> None:
    """List, describe and delete share groups."""


@share_group.command("list")
@format_option
@connection_options
def list_(fmt, target: Target) -> None:
    """Every share group, with its state."""
    async def go():
        async with admin_client(target) as admin:
            return [g for g in await admin.list_groups() if g.type == "share"]
    groups = run(target, go())
    if fmt == "json":
        print_json([{"group": g.group, "state": g.state} for g in groups])
    else:
        print_table(["GROUP", "STATE"], [[g.group, g.state] for g in groups])


share_group.add_command(group_describe, "describe")
share_group.add_command(group_delete, "delete")
