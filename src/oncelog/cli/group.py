"""`oncelog group`: consumer groups as kafka-consumer-groups and `rpk group` show and change them:
list (with each group's type: classic, or consumer for KIP-848), describe (one, several or
`--all-groups`: members, with their epochs for a consumer group, and per partition the committed
offset, the log end and the lag), delete, seek (reset the committed offsets of a group without
members: to start, end, an offset, a time, a duration back, or shifted by N, as
kafka-consumer-groups --reset-offsets), delete-offsets (OffsetDelete)."""
from __future__ import annotations

import time

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
from oncelog.cli.options import duration_ms, when


@click.group("group")
def group() -> None:
    """List, describe, delete consumer groups and move their offsets."""


@group.command("list")
@format_option
@connection_options
def list_(fmt, target: Target) -> None:
    """Every group, with its state."""
    async def go():
        async with admin_client(target) as admin:
            return await admin.list_groups()
    groups = run(target, go())
    if fmt == "json":
        print_json([{"group": g.group, "state": g.state, "protocol_type": g.protocol_type, "type": g.type}
                    for g in groups])
    else:
        print_table(["GROUP", "TYPE", "STATE", "PROTOCOL-TYPE"],
                    [[g.group, g.type, g.state, g.protocol_type] for g in groups])


async def _describe(admin, name: str) -> dict:
    from oncelog.client.types import TopicPartition
    described = await admin.describe_group(name)
    if described.type == "share":
        return await _describe_share(admin, described)
    committed = await admin.list_group_offsets(name)
    if described.state == "Dead" and not committed:
        raise CommandError(f"group {name} does not exist", REFUSED)
    assigned = {tp: m for m in described.members for tp in m.assignment}
    partitions = sorted(set(committed) | set(assigned))
    ends: dict = {}
    for topic in sorted({tp.topic for tp in partitions}):
        ends.update({TopicPartition(topic, p.partition): p.log_end_offset
                     for p in await admin.describe_partitions(topic)})
    rows = []
    for tp in partitions:
        c, end = committed.get(tp), ends.get(tp)
        m = assigned.get(tp)
        rows.append({"topic": tp.topic, "partition": tp.partition, "committed_offset": c, "log_end_offset": end,
                     "lag": None if c is None or end is None else max(0, end - c),
                     "member_id": m.member_id if m else None})
    out = {"group": name, "type": described.type, "state": described.state, "protocol": described.protocol,
           "members": [{"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
                        "host": m.host, "assignment": _partitions(m.assignment)}
                       for m in described.members],
           "partitions": rows}
    if described.type == "consumer":   # KIP-848: the epochs, and what each member is moving to
        out["group_epoch"], out["assignment_epoch"] = described.group_epoch, described.assignment_epoch
        for row, m in zip(out["members"], described.members):
            row["member_epoch"], row["target_assignment"] = m.member_epoch, _partitions(m.target)
    return out


async def _describe_share(admin, described) -> dict:
    """A share group (KIP-932): members share partitions and have epochs; per share-partition
    (each the group has a state for) its start offset and lag (DescribeShareGroupOffsets, as
    kafka-share-groups --describe --offsets), no committed offsets."""
    from oncelog.client.aio.admin_base import AdminError
    from oncelog.client.errors import KafkaClientError
    try:
        offsets = await admin.list_share_group_offsets(described.group)
    except AdminError:
        raise
    except KafkaClientError:   # a broker before DescribeShareGroupOffsets: the members alone
        offsets = {}
    return {"group": described.group, "type": "share", "state": described.state, "protocol": described.protocol,
            "group_epoch": described.group_epoch, "assignment_epoch": described.assignment_epoch,
            "members": [{"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
                         "host": m.host, "assignment": _partitions(m.assignment), "member_epoch": m.member_epoch}
                        for m in described.members],
            "partitions": [{"topic": tp.topic, "partition": tp.partition, "start_offset": o.start_offset,
                            "lag": o.lag} for tp, o in sorted(offsets.items()) if o.start_offset is not None]}


def _partitions(tps) -> list[dict]:
    return [{"topic": tp.topic, "partition": tp.partition} for tp in tps]


@group.command("describe")
@click.argument("names", nargs=-1)
@click.option("--all-groups", is_flag=True, help="Every group the cluster has (kafka-consumer-groups' option).")
@format_option
@connection_options
def describe(names, all_groups, fmt, target: Target) -> None:
    """Groups NAMES (or --all-groups): state, members, and per partition the committed offset, log end
    offset and lag. JSON: one object for one NAME, else a list of them."""
    if bool(names) == all_groups:
        raise CommandError("name the groups to describe, or give --all-groups", USAGE)

    async def go():
        async with admin_client(target) as admin:
            chosen = sorted(g.group for g in await admin.list_groups()) if all_groups else list(names)
            return [await _describe(admin, name) for name in chosen]
    described = run(target, go())
    if fmt == "json":
        print_json(described[0] if len(names) == 1 else described)
        return
    for i, d in enumerate(described):
        if i:
            click.echo()
        _print_description(d)


def _print_description(d: dict, sections: tuple[str, ...] = ("members", "offsets")) -> None:
    """`sections`: what a share group shows besides its state (kafka-share-groups' --members,
    --offsets, --state)."""
    total = sum(r["lag"] or 0 for r in d["partitions"])
    kind = (f", {d['type']} group at epoch {d['group_epoch']} (assignment epoch {d['assignment_epoch']})"
            if d["type"] in ("consumer", "share") else "")
    click.echo(f"group {d['group']}: {d['state']}{kind}" + (f", assignor {d['protocol']}" if d["type"] != "classic"
                                                          else f", protocol {d['protocol']}" if d["protocol"] else "")
               + f", {len(d['members'])} members, total lag {total}")
    if d["type"] != "share" or sections:
        click.echo()
    if d["type"] == "consumer" and d["members"]:
        print_table(["MEMBER", "EPOCH", "CLIENT-ID", "HOST", "ASSIGNED", "TARGET"],
                    [[m["member_id"], m["member_epoch"], m["client_id"], m["host"], _short(m["assignment"]),
                      _short(m["target_assignment"])] for m in d["members"]])
        click.echo()
    if d["type"] == "share":
        if "members" in sections and d["members"]:
            print_table(["MEMBER", "EPOCH", "CLIENT-ID", "HOST", "ASSIGNED"],
                        [[m["member_id"], m["member_epoch"], m["client_id"], m["host"], _short(m["assignment"])]
                         for m in d["members"]])
            if "offsets" in sections:
                click.echo()
        if "offsets" in sections:
            print_table(["TOPIC", "PARTITION", "START-OFFSET", "LAG"],
                        [[r["topic"], r["partition"], r["start_offset"], _dash(r["lag"])] for r in d["partitions"]])
        return
    print_table(["TOPIC", "PARTITION", "COMMITTED-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER"],
                [[r["topic"], r["partition"], _dash(r["committed_offset"]), _dash(r["log_end_offset"]),
                  _dash(r["lag"]), r["member_id"] or ""] for r in d["partitions"]])


def _short(tps: list[dict]) -> str:
    """`t:0,1 u:2`"""
    by_topic: dict[str, list[int]] = {}
    for tp in tps:
        by_topic.setdefault(tp["topic"], []).append(tp["partition"])
    return " ".join(f"{t}:{','.join(map(str, sorted(ps)))}" for t, ps in sorted(by_topic.items())) or "-"


def _dash(v):
    return "-" if v is None else v


@group.command("delete")
@click.argument("names", nargs=-1, required=True)
@connection_options
def delete(names, target: Target) -> None:
    """Delete groups NAMES (with their committed offsets); a group with members is refused."""
    async def go():
        async with admin_client(target) as admin:
            await admin.delete_groups(list(names))
    run(target, go())
    for n in names:
        click.echo(f"deleted group {n}")


def _to(value: str) -> tuple[str, int]:
    if value in ("start", "earliest"):
        return "start", 0
    if value in ("end", "latest"):
        return "end", 0
    if value.isdigit():
        return "offset", int(value)
    at = when(value[1:] if value.startswith("@") else value)
    if at is not None and (value.startswith("@") or not value.isdigit()):
        return "time", at
    raise CommandError(f"--to {value!r}: expected start, end, an offset, @TIMESTAMP (ms), a time before now "
                       "(-1h) or an ISO time", USAGE)


def _where(to, to_datetime, by_duration, shift_by) -> tuple[str, int]:
    given = [name for name, v in (("--to", to), ("--to-datetime", to_datetime), ("--by-duration", by_duration),
                                  ("--shift-by", shift_by)) if v is not None]
    if len(given) != 1:
        raise CommandError("give one of --to, --to-datetime, --by-duration, --shift-by"
                           + (f" (got {', '.join(given)})" if given else ""), USAGE)
    if to is not None:
        return _to(to)
    if to_datetime is not None:
        at = when(to_datetime)
        if at is None or to_datetime.isdigit() or to_datetime.startswith("-"):
            raise CommandError(f"--to-datetime {to_datetime!r}: expected an ISO time such as "
                               "2026-01-31T12:00:00Z (without a zone: UTC)", USAGE)
        return "time", at
    if by_duration is not None:
        ms = duration_ms(by_duration)
        if ms is None:
            raise CommandError(f"--by-duration {by_duration!r}: expected a duration such as PT1H, P1DT12H or 30m",
                               USAGE)
        return "time", int(time.time() * 1000) - ms
    return "shift", int(shift_by)


@group.command("seek")
@click.argument("name")
@click.option("--to", "to", help="start, end, an offset, @TIMESTAMP (ms since the epoch), a time before now (-1h) "
              "or an ISO time.")
@click.option("--to-datetime", help="The first offset at or after this ISO time, e.g. 2026-01-31T12:00:00Z "
              "(kafka-consumer-groups' option).")
@click.option("--by-duration", help="The first offset at or after this long ago: PT1H, P1DT12H, 30m "
              "(kafka-consumer-groups' option).")
@click.option("--shift-by", type=int, help="Move each committed offset by N (negative: back), kept within the log "
              "(kafka-consumer-groups' option).")
@click.option("--topic", "topics", multiple=True, help="Only (or also) this topic's partitions (repeatable); "
              "default: every partition the group has an offset for.")
@click.option("--dry-run", is_flag=True, help="Show the new offsets without committing them.")
@format_option
@connection_options
def seek(name, to, to_datetime, by_duration, shift_by, topics, dry_run, fmt, target: Target) -> None:
    """Move group NAME's committed offsets (the group must have no members)."""
    kind, n = _where(to, to_datetime, by_duration, shift_by)

    async def go():
        from oncelog.client.types import EARLIEST, LATEST, TopicPartition
        async with admin_client(target) as admin:
            described = await admin.describe_group(name)
            if described.members:
                raise CommandError(f"group {name} has {len(described.members)} active members: stop them "
                                   "before moving its offsets", REFUSED)
            committed = await admin.list_group_offsets(name)
            if topics:
                tps = [TopicPartition(t, p.partition) for t in topics for p in await admin.describe_partitions(t)]
            else:
                tps = sorted(committed)
            if not tps:
                raise CommandError(f"group {name} has no offsets: name the partitions with --topic", REFUSED)
            starts = await admin.list_offsets(tps, EARLIEST)
            ends = await admin.list_offsets(tps, LATEST)
            if kind == "start":
                new = starts
            elif kind == "end":
                new = ends
            elif kind == "time":
                found = await admin.list_offsets(tps, n)
                new = {tp: ends[tp] if found[tp] is None else found[tp] for tp in tps}
            elif kind == "shift":   # from the committed offset (the start where there is none), as Kafka
                new = {tp: min(max(committed.get(tp, starts[tp] or 0) + n, starts[tp] or 0), ends[tp] or 0)
                       for tp in tps}
            else:   # as kafka-consumer-groups: an offset outside the log is moved to its nearest end
                new = {tp: min(max(n, starts[tp] or 0), ends[tp] or 0) for tp in tps}
            if not dry_run:
                await admin.alter_group_offsets(name, {tp: int(off or 0) for tp, off in new.items()})
            return [{"topic": tp.topic, "partition": tp.partition, "previous_offset": committed.get(tp),
                     "new_offset": int(new[tp] or 0)} for tp in tps]
    rows = run(target, go())
    if fmt == "json":
        print_json(rows)
        return
    print_table(["TOPIC", "PARTITION", "PREVIOUS-OFFSET", "NEW-OFFSET"],
                [[r["topic"], r["partition"], _dash(r["previous_offset"]), r["new_offset"]] for r in rows])
    if dry_run:
        click.echo("(dry run: nothing committed)", err=True)


@group.command("delete-offsets")
@click.argument("name")
@click.option("--topic", required=True, help="The topic whose committed offsets go.")
@click.option("-p", "--partition", "partitions", multiple=True, type=click.IntRange(0),
              help="Only this partition (repeatable); default every partition of the topic.")
@format_option
@connection_options
def delete_offsets(name, topic, partitions, fmt, target: Target) -> None:
    """Forget group NAME's committed offsets of a topic (kafka-consumer-groups --delete-offsets;
    refused while a member of the group consumes it)."""
    async def go():
        from oncelog.client.types import TopicPartition
        async with admin_client(target) as admin:
            parts = partitions or [p.partition for p in await admin.describe_partitions(topic)]
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            await admin.delete_group_offsets(name, tps)
            return [{"topic": tp.topic, "partition": tp.partition} for tp in tps]
    rows = run(target, go())
    if fmt == "json":
        print_json(rows)
    else:
        for r in rows:
            click.echo(f"deleted the offset of group {name} on {r['topic']}-{r['partition']}")
