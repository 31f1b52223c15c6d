"""`oncelog topic`: kafka-topics' and `rpk topic`'s daily work (create, list, describe, add
partitions, alter configs, delete), and delete-records (kafka-delete-records.sh; `trim-prefix`,
rpk's name, is the same command)."""
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
from oncelog.cli.options import when


@click.group("topic")
def topic() -> None:
    """Create, list, describe, grow, configure and delete topics."""


@topic.command("create")
@click.argument("names", nargs=-1, required=True)
@click.option("-p", "--partitions", type=click.IntRange(1), default=1, show_default=True)
@click.option("-r", "--replication-factor", type=click.IntRange(-1), default=1, show_default=True,
              help="1 (a single node has no replicas) or -1 (the broker's default).")
@click.option("-c", "--config", "configs", multiple=True, metavar="NAME=VALUE",
              help="A topic config (repeatable), e.g. -c cleanup.policy=compact.")
@connection_options
def create(names, partitions, replication_factor, configs, target: Target) -> None:
    """Create topics NAMES."""
    settings = parse_assignments(configs, "-c")

    async def go():
        from oncelog.client.aio.admin import NewTopic
        async with admin_client(target) as admin:
            await admin.create_topics([NewTopic(n, partitions, replication_factor, settings) for n in names])
    run(target, go())
    for n in names:
        click.echo(f"created topic {n} ({partitions} partition{'s' if partitions != 1 else ''})")


@topic.command("list")
@click.option("-i", "--internal/--no-internal", default=True, show_default=True,
              help="List the internal topics (__consumer_offsets, __transaction_state) too.")
@format_option
@connection_options
def list_(internal, fmt, target: Target) -> None:
    """Every topic, with its partition count."""
    async def go():
        async with admin_client(target) as admin:
            return [t._asdict() for t in await admin.topic_listings() if internal or not t.internal]
    topics = run(target, go())
    if fmt == "json":
        print_json(topics)
    else:
        print_table(["NAME", "PARTITIONS", "INTERNAL"],
                    [[t["name"], t["partitions"], "yes" if t["internal"] else ""] for t in topics])


@topic.command("describe")
@click.argument("name")
@click.option("--all-configs", is_flag=True, help="Every config with its source, not only the topic's overrides.")
@format_option
@connection_options
def describe(name, all_configs, fmt, target: Target) -> None:
    """A topic's partitions (leader, log start and end offsets) and configs."""
    async def go():
        from oncelog.client.aio.admin_cluster import TOPIC_RESOURCE
        async with admin_client(target) as admin:
            partitions = await admin.describe_partitions(name)
            entries = await admin.config_entries(TOPIC_RESOURCE, name)
        return partitions, entries
    partitions, entries = run(target, go())
    shown = [e for e in entries if all_configs or e.source == "TOPIC_CONFIG"]
    if fmt == "json":
        print_json({"name": name, "partitions": [
            {"partition": p.partition, "leader": p.leader, "log_start_offset": p.log_start_offset,
             "log_end_offset": p.log_end_offset} for p in partitions], "configs": {e.name: e.value for e in shown}})
        return
    print_table(["PARTITION", "LEADER", "EPOCH", "LOG-START-OFFSET", "LOG-END-OFFSET"],
                [[p.partition, p.leader, p.leader_epoch, p.log_start_offset, p.log_end_offset] for p in partitions])
    if shown:
        click.echo()
        print_table(["CONFIG", "VALUE", "SOURCE"], [[e.name, e.value, e.source] for e in shown])


@topic.command("add-partitions")
@click.argument("name")
@click.option("--to", "total", type=click.IntRange(1), required=True, help="The partition count to grow to.")
@connection_options
def add_partitions(name, total, target: Target) -> None:
    """Grow topic NAME to --to partitions (keys then map to other partitions)."""
    async def go():
        async with admin_client(target) as admin:
            await admin.create_partitions(name, total)
    run(target, go())
    click.echo(f"topic {name} has {total} partitions")


@topic.command("alter-config")
@click.argument("name")
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE", help="Set a config (repeatable).")
@click.option("--delete", "deletes", multiple=True, metavar="NAME",
              help="Remove an override, back to the broker's default (repeatable).")
@connection_options
def alter_config(name, sets, deletes, target: Target) -> None:
    """Change topic NAME's configs (incrementally: others stay as they are)."""
    changes: dict[str, str | None] = dict(parse_assignments(sets, "--set"))
    changes.update(dict.fromkeys(deletes))
    if not changes:
        raise CommandError("nothing to change: give --set NAME=VALUE or --delete NAME", USAGE)

    async def go():
        async with admin_client(target) as admin:
            await admin.alter_configs(name, changes)
    run(target, go())
    click.echo(f"altered configs of topic {name}")


@topic.command("delete")
@click.argument("names", nargs=-1, required=True)
@connection_options
def delete(names, target: Target) -> None:
    """Delete topics NAMES and their records."""
    async def go():
        async with admin_client(target) as admin:
            await admin.delete_topics(list(names))
    run(target, go())
    for n in names:
        click.echo(f"deleted topic {n}")


def _delete_records(name, offset, partitions, fmt, target: Target) -> None:
    where = offset.strip().lower()
    at = None
    if where not in ("end", "latest") and not where.isdigit():
        at = when(offset[1:] if offset.startswith("@") else offset)
        if at is None:
            raise CommandError(f"-o {offset!r}: expected an offset, end, @TIMESTAMP (ms), a time before now (-1h) "
                               "or an ISO time", USAGE)

    async def go():
        from oncelog.client.types import LATEST, TopicPartition
        async with admin_client(target) as admin:
            count = len(await admin.describe_partitions(name))
            missing = sorted(p for p in partitions if p >= count)
            if missing:
                raise CommandError(f"topic {name} has {count} partitions: no partition {missing[0]}", USAGE)
            tps = [TopicPartition(name, p) for p in (partitions or range(count))]
            if where in ("end", "latest"):
                offsets = {tp: off or 0 for tp, off in (await admin.list_offsets(tps, LATEST)).items()}
            elif at is not None:   # records before the time go: the first offset at or after it stays
                ends = await admin.list_offsets(tps, LATEST)
                found = await admin.list_offsets(tps, at)
                offsets = {tp: ends[tp] or 0 if found[tp] is None else found[tp] for tp in tps}
            else:
                offsets = dict.fromkeys(tps, int(where))
            done = await admin.delete_records({(tp.topic, tp.partition): off for tp, off in offsets.items()})
            return [{"topic": t, "partition": p, "log_start_offset": low} for (t, p), low in sorted(done.items())]
    rows = run(target, go())
    if fmt == "json":
        print_json(rows)
    else:
        print_table(["PARTITION", "LOG-START-OFFSET"], [[r["partition"], r["log_start_offset"]] for r in rows])


_DELETE_RECORDS_HELP = ("Delete TOPIC's records below an offset (DeleteRecords, as kafka-delete-records.sh and "
                        "`rpk topic trim-prefix`): its log start offset moves there.")


def _delete_records_command(command_name: str):
    @topic.command(command_name, help=_DELETE_RECORDS_HELP)
    @click.argument("name")
    @click.option("-o", "--offset", required=True, help="The new log start offset: an offset, end (every record), "
                  "@TIMESTAMP (ms), a time before now (-1h) or an ISO time (records before it go).")
    @click.option("-p", "--partition", "partitions", multiple=True, type=click.IntRange(0),
                  help="Only this partition (repeatable); default every partition.")
    @format_option
    @connection_options
    def command(name, offset, partitions, fmt, target: Target) -> None:
        _delete_records(name, offset, partitions, fmt, target)
    return command


delete_records = _delete_records_command("delete-records")
trim_prefix = _delete_records_command("trim-prefix")   # rpk's name
