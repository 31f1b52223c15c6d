"""`oncelog cluster`: who is in the cluster (`rpk cluster info`), the brokers' settings
(`rpk cluster config get|set`, kafka-configs --entity-type brokers): a change is made on the
running broker where Kafka allows it at runtime, and refused with the reason where not; and the
log directories (`rpk cluster logdirs describe`, kafka-log-dirs.sh)."""
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


@click.group("cluster")
def cluster() -> None:
    """The cluster's brokers and their settings."""


@cluster.command("info")
@format_option
@connection_options
def info(fmt, target: Target) -> None:
    """Cluster id, controller and brokers."""
    async def go():
        async with admin_client(target) as admin:
            return await admin.describe_cluster()
    c = run(target, go())
    out = {"cluster_id": c.cluster_id, "controller_id": c.controller_id,
           "brokers": [{"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack} for b in c.brokers]}
    if fmt == "json":
        print_json(out)
        return
    click.echo(f"cluster {c.cluster_id}, controller {c.controller_id}")
    click.echo()
    print_table(["NODE", "HOST", "PORT", "RACK"], [[b.node_id, b.host, b.port, b.rack or ""] for b in c.brokers])


@cluster.group("config")
def config() -> None:
    """A broker's settings."""


async def _broker(admin, node: int | None) -> int:
    """`node`, checked against the cluster's brokers; the lowest node id when None."""
    brokers = sorted(b.node_id for b in (await admin.describe_cluster()).brokers)
    if node is None:
        return brokers[0]
    if node not in brokers:
        raise CommandError(f"no broker {node} (brokers: {', '.join(map(str, brokers))})")
    return node


@config.command("get")
@click.argument("names", nargs=-1)
@click.option("--broker", "node", type=int, help="The broker's node id (default: the lowest).")
@format_option
@connection_options
def get(names, node, fmt, target: Target) -> None:
    """Broker settings NAMES (all without names), with their sources."""
    async def go():
        from oncelog.client.aio.admin_cluster import BROKER_RESOURCE
        async with admin_client(target) as admin:
            return await admin.config_entries(BROKER_RESOURCE, str(await _broker(admin, node)))
    entries = run(target, go())
    if names:
        known = {e.name for e in entries}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise CommandError(f"no broker setting {unknown[0]}")
        entries = [e for e in entries if e.name in names]
    if fmt == "json":
        print_json({e.name: e.value for e in entries})
        return
    print_table(["NAME", "VALUE", "SOURCE", "READ-ONLY"],
                [[e.name, "(hidden)" if e.sensitive else e.value, e.source, "yes" if e.read_only else ""]
                 for e in entries])


@config.command("set")
@click.argument("assignments", nargs=-1, metavar="NAME=VALUE...")
@click.option("--delete", "deletes", multiple=True, metavar="NAME", help="Remove a dynamic value (repeatable).")
@click.option("--broker", "node", type=int, help="The broker's node id (default: the lowest).")
@connection_options
def set_(assignments, deletes, node, target: Target) -> None:
    """Change broker settings at runtime."""
    changes: dict[str, str | None] = dict(parse_assignments(assignments, "setting"))
    changes.update(dict.fromkeys(deletes))
    if not changes:
        raise CommandError("nothing to change: give NAME=VALUE or --delete NAME", USAGE)

    async def go():
        async with admin_client(target) as admin:
            chosen = await _broker(admin, node)
            await admin.alter_broker_configs(chosen, changes)
            return chosen
    chosen = run(target, go())
    click.echo(f"broker {chosen}: altered {', '.join(changes)}")


@cluster.command("log-dirs")
@click.option("--topic", "topics", multiple=True, help="Only this topic's partitions (repeatable); default all.")
@format_option
@connection_options
def log_dirs(topics, fmt, target: Target) -> None:
    """Each broker's log directories: the volume's size and free bytes, and the bytes of each partition
    (kafka-log-dirs.sh --describe, `rpk cluster logdirs describe`; DescribeLogDirs)."""
    async def go():
        async with admin_client(target) as admin:
            return await admin.describe_log_dirs(list(topics) or None)
    dirs = run(target, go())
    if fmt == "json":
        print_json(dirs)
        return
    print_table(["BROKER", "DIR", "TOTAL-BYTES", "USABLE-BYTES", "ERROR"],
                [[d["broker"], d["log_dir"], d["total_bytes"], d["usable_bytes"], d["error"] or ""] for d in dirs])
    click.echo()
    print_table(["BROKER", "DIR", "TOPIC", "PARTITION", "SIZE-BYTES", "OFFSET-LAG"],
                [[d["broker"], d["log_dir"], p["topic"], p["partition"], p["size_bytes"], p["offset_lag"]]
                 for d in dirs for p in d["partitions"]])
