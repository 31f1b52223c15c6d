"""`oncelog share-group`: share groups (KIP-932) as kafka-share-groups.sh shows and changes them:
list, describe (state, epochs, members with their epochs and the partitions they share, and per
share-partition its start offset and lag: DescribeShareGroupOffsets), delete (an empty share
group, with its share-partitions' state), reset-offsets (AlterShareGroupOffsets: where the
share-partitions of a group without members start again) and delete-offsets
(DeleteShareGroupOffsets: a group's state of whole topics). The same groups appear in
`oncelog group list` with type `share`."""
from __future__ import annotations

import click

from oncelog.cli.connect import (
    REFUSED,
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
from oncelog.cli.group import _describe, _print_description
from oncelog.cli.group import delete as group_delete
from oncelog.cli.options import when


@click.group("share-group")
def share_group() -> None:
    """List, describe and delete share groups; reset and delete their offsets."""


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


@share_group.command("describe")
@click.argument("names", nargs=-1)
@click.option("--all-groups", is_flag=True, help="Every share group of the cluster.")
@click.option("--offsets", is_flag=True, help="Only the state and each share-partition's start offset and lag "
              "(kafka-share-groups' option).")
@click.option("--members", is_flag=True, help="Only the state and the members (kafka-share-groups' option).")
@click.option("--state", "state_only", is_flag=True, help="Only the state (kafka-share-groups' option).")
@format_option
@connection_options
def describe(names, all_groups, offsets, members, state_only, fmt, target: Target) -> None:
    """Share groups NAMES (or --all-groups): state, epochs, members, and per share-partition its
    start offset and lag (records from the start offset to the log end not yet done with). JSON:
    one object for one NAME, else a list of them; --offsets, --members and --state choose what
    the text shows."""
    if bool(names) == all_groups:
        raise CommandError("name the share groups to describe, or give --all-groups", USAGE)
    if offsets + members + state_only > 1:
        raise CommandError("give at most one of --offsets, --members, --state", USAGE)
    sections = ("offsets",) if offsets else ("members",) if members else () if state_only else ("members", "offsets")

    async def go():
        async with admin_client(target) as admin:
            chosen = (sorted(g.group for g in await admin.list_groups() if g.type == "share") if all_groups
                      else list(names))
            out = []
            for name in chosen:
                d = await _describe(admin, name)
                if d["type"] != "share":
                    raise CommandError(f"group {name} is a {d['type']} group, not a share group "
                                       "(`oncelog group describe` shows it)", REFUSED)
                out.append(d)
            return out
    described = run(target, go())
    if fmt == "json":
        print_json(described[0] if len(names) == 1 else described)
        return
    for i, d in enumerate(described):
        if i:
            click.echo()
        _print_description(d, sections)


share_group.add_command(group_delete, "delete")


def _topic_partitions(values: tuple[str, ...]) -> list[tuple[str, list[int] | None]]:
    """kafka-share-groups' `--topic TOPIC` (every partition) or `--topic TOPIC:0,1`."""
    out: list[tuple[str, list[int] | None]] = []
    for value in values:
        topic, sep, parts = value.partition(":")
        if not topic or (sep and not parts):
            raise CommandError(f"--topic {value!r}: expected TOPIC or TOPIC:PARTITION,PARTITION", USAGE)
        try:
            out.append((topic, [int(p) for p in parts.split(",")] if sep else None))
        except ValueError:
            raise CommandError(f"--topic {value!r}: partitions are numbers (TOPIC:0,1)", USAGE) from None
    return out


@share_group.command("reset-offsets")
@click.argument("name")
@click.option("--to-earliest", is_flag=True, help="The log start of each partition.")
@click.option("--to-latest", is_flag=True, help="The log end of each partition: only records produced from now on.")
@click.option("--to-datetime", help="The first offset at or after this ISO time, e.g. 2026-01-31T12:00:00Z "
              "(without a zone: UTC); the log end where no record is that recent.")
@click.option("--to-offset", type=click.IntRange(0), help="This offset, moved into the log where it is outside "
              "(not in kafka-share-groups; as kafka-consumer-groups' --to-offset).")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC[:P,P]",
              help="The partitions to reset: all of TOPIC, or those listed (repeatable).")
@click.option("--all-topics", is_flag=True, help="Every share-partition the group has a state for.")
@click.option("--dry-run", is_flag=True, help="Show the new start offsets; change nothing.")
@click.option("--execute", is_flag=True, help="Change them (kafka-share-groups needs one of --dry-run, --execute).")
@format_option
@connection_options
def reset_offsets(name, to_earliest, to_latest, to_datetime, to_offset, topics, all_topics, dry_run, execute, fmt,
                  target: Target) -> None:
    """Set where share group NAME's share-partitions start (kafka-share-groups --reset-offsets). The
    group must have no members; what was in flight there is forgotten, and a share consumer of the
    group starts at the new offset, also after a broker restart."""
    scenarios = [flag for flag, given in (("--to-earliest", to_earliest), ("--to-latest", to_latest),
                                          ("--to-datetime", to_datetime is not None),
                                          ("--to-offset", to_offset is not None)) if given]
    if len(scenarios) != 1:
        raise CommandError("give one of --to-earliest, --to-latest, --to-datetime, --to-offset"
                           + (f" (got {', '.join(scenarios)})" if scenarios else ""), USAGE)
    if dry_run == execute:
        raise CommandError("give one of --dry-run (show the new offsets) and --execute (set them)", USAGE)
    if bool(topics) == all_topics:
        raise CommandError("name the partitions with --topic, or give --all-topics", USAGE)
    at = None
    if to_datetime is not None:
        at = when(to_datetime)
        if at is None or to_datetime.isdigit() or to_datetime.startswith("-"):
            raise CommandError(f"--to-datetime {to_datetime!r}: expected an ISO time such as "
                               "2026-01-31T12:00:00Z (without a zone: UTC)", USAGE)
    named = _topic_partitions(topics)

    async def go():
        from oncelog.client.types import EARLIEST, LATEST, TopicPartition
        async with admin_client(target) as admin:
            described = await admin.describe_group(name)
            if described.type != "share" and described.state != "Dead":
                raise CommandError(f"group {name} is a {described.type} group, not a share group", REFUSED)
            if described.members:
                raise CommandError(f"share group {name} has {len(described.members)} members: stop them before "
                                   "resetting its offsets", REFUSED)
            current = await admin.list_share_group_offsets(name) if described.type == "share" else {}
            if all_topics:
                tps = sorted(tp for tp, o in current.items() if o.start_offset is not None)
                if not tps:
                    raise CommandError(f"share group {name} has no share-partitions: name them with --topic", REFUSED)
            else:
                tps = []
                for topic, parts in named:
                    have = [p.partition for p in await admin.describe_partitions(topic)]
                    for p in parts if parts is not None else have:
                        if p not in have:
                            raise CommandError(f"{topic} has no partition {p}", REFUSED)
                        tps.append(TopicPartition(topic, p))
                tps = sorted(set(tps))
            starts = await admin.list_offsets(tps, EARLIEST)
            ends = await admin.list_offsets(tps, LATEST)
            if to_earliest:
                new = starts
            elif to_latest:
                new = ends
            elif at is not None:
                found = await admin.list_offsets(tps, at)
                new = {tp: ends[tp] if found[tp] is None else found[tp] for tp in tps}
            else:   # as kafka-consumer-groups: an offset outside the log is moved to its nearest end
                new = {tp: min(max(to_offset, starts[tp] or 0), ends[tp] or 0) for tp in tps}
            new = {tp: int(new[tp] or 0) for tp in tps}
            if execute:
                await admin.alter_share_group_offsets(name, new)
            return [{"topic": tp.topic, "partition": tp.partition,
                     "previous_offset": current[tp].start_offset if tp in current else None,
                     "new_offset": new[tp]} for tp in tps]
    rows = run(target, go())
    if fmt == "json":
        print_json(rows)
    else:
        print_table(["TOPIC", "PARTITION", "PREVIOUS-OFFSET", "NEW-OFFSET"],
                    [[r["topic"], r["partition"], "-" if r["previous_offset"] is None else r["previous_offset"],
                      r["new_offset"]] for r in rows])
    if dry_run:
        click.echo("(dry run: nothing changed; --execute sets these)", err=True)


@share_group.command("delete-offsets")
@click.argument("name")
@click.option("--topic", "topics", multiple=True, required=True, help="A topic whose state goes (repeatable).")
@format_option
@connection_options
def delete_offsets(name, topics, fmt, target: Target) -> None:
    """Delete share group NAME's state of whole topics (kafka-share-groups --delete-offsets; the
    group must have no members): their share-partitions start again at share.auto.offset.reset.
    Exit code 1 if any topic's state could not be deleted."""
    async def go():
        async with admin_client(target) as admin:
            return await admin.delete_share_group_offsets(name, list(topics))
    outcomes = run(target, go())
    rows = [{"topic": t, "error": None if not int(code) else code.name} for t, code in outcomes.items()]
    if fmt == "json":
        print_json(rows)
    else:
        print_table(["TOPIC", "STATUS"], [[r["topic"], r["error"] or "deleted"] for r in rows])
    failed = [r for r in rows if r["error"]]
    if failed:
        raise CommandError("not deleted: " + ", ".join(f"{r['topic']} ({r['error']})" for r in failed), REFUSED)
