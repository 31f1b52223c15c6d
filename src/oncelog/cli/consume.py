"""`oncelog consume`: print a topic's records (kafka-console-consumer, `rpk topic consume`).

Where to start: `-o start|end|OFFSET|@TIMESTAMP|-DURATION|ISO-TIME` on every partition (default
start; `-1h` is an hour ago, `2026-01-31T12:00:00Z` a time, as rpk's `-o @-1h` and `-o @TIME`).

With `-g GROUP` the command joins the group as a member, as kafka-console-consumer --group and
`rpk topic consume -g` do: consumers of one group share the topic's partitions, each reads from the
group's committed offsets (`-o start|end` only says where partitions without one begin: the
consumer's auto.offset.reset), and what it prints is committed as it goes and when it stops. With
`-g` and `-p`, it reads the partitions given without joining, from the group's committed offsets,
and commits for the group as a consumer with assigned partitions does (the coordinator accepts
that while the group has no members).

With `--share-group GROUP` the command is a member of that share group (KIP-932): consoles of one
share group share the work, each record printed by one of them and accepted once printed
(implicit acknowledgement); -o, -p, -g and -e do not apply (the group decides what each member
gets).

When to stop: after `-n NUM` records, at the end of the partitions as they were when it started
(`-e`), or at Ctrl-C.

How to print (`--format`): `text` the value alone, `json` one object per line ({"topic",
"partition", "offset", "timestamp", "key", "value", "headers"}; a key or value that is not
UTF-8 is {"base64": ...}), or a template in rpk's syntax: %t topic, %p partition, %o offset,
%k key, %v value, %T timestamp (ms), %h headers, %% a percent sign; \\n and \\t are escapes."""
from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import sys

import click

from oncelog.cli.connect import USAGE, CommandError, Target, connection_options, run
from oncelog.cli.options import DURATION as _DURATION
from oncelog.cli.options import when

_TEMPLATE = re.compile(rb"%[tpokvTh%]|\\[nt\\]")


def _text(data: bytes | None):
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def _json_line(r) -> bytes:
    return json.dumps({"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
                       "key": _text(r.key), "value": _text(r.value),
                       "headers": [[k, _text(v)] for k, v in r.headers]}).encode() + b"\n"


def _formatter(fmt: str):
    if fmt == "json":
        return _json_line
    if fmt == "text":
        return lambda r: (r.value or b"") + b"\n"
    template = fmt.encode()

    def render(r) -> bytes:
        def field(m: re.Match) -> bytes:
            code = m.group()
            if code == b"%t":
                return r.topic.encode()
            if code == b"%p":
                return str(r.partition).encode()
            if code == b"%o":
                return str(r.offset).encode()
            if code == b"%k":
                return r.key or b""
            if code == b"%v":
                return r.value or b""
            if code == b"%T":
                return str(r.timestamp).encode()
            if code == b"%h":
                return b",".join(k.encode() + b"=" + (v or b"") for k, v in r.headers)
            return {b"%%": b"%", b"\\n": b"\n", b"\\t": b"\t", b"\\\\": b"\\"}[code]
        return _TEMPLATE.sub(field, template)
    return render


def _start(value: str) -> tuple[str, int]:
    """('start'|'end'|'offset'|'time', number)."""
    if value in ("start", "beginning", "oldest"):
        return "start", 0
    if value in ("end", "newest", "latest"):
        return "end", 0
    if value.startswith("@") or _DURATION.fullmatch(value) or not value.lstrip("-").isdigit():
        at = when(value[1:] if value.startswith("@") else value)
        if at is None:
            raise CommandError(f"-o {value!r}: expected start, end, an offset, @TIMESTAMP (ms), a time "
                               "before now such as -1h, or an ISO time such as 2026-01-31T12:00:00Z", USAGE)
        return "time", at
    n = int(value)
    if n < 0:
        raise CommandError(f"-o {value}: an offset is not negative", USAGE)
    return "offset", n


@click.command("consume")
@click.argument("topic")
@click.option("-p", "--partition", "partitions", multiple=True, type=click.IntRange(0),
              help="Read only this partition (repeatable); default all.")
@click.option("-o", "--offset", "start", default="start", show_default=True,
              help="Where to start: start, end, an offset, @TIMESTAMP (ms since the epoch), a time before "
              "now (-1h, -30m, -2d) or an ISO time (2026-01-31T12:00:00Z). With -g: start or end, for "
              "partitions the group has no offset for.")
@click.option("-n", "--num", type=click.IntRange(0), help="Stop after this many records (0: no limit, as "
              "rpk's -n 0).")
@click.option("-e", "--exit-at-end", is_flag=True, help="Stop at the end of the partitions as of the start.")
@click.option("-g", "--group", help="Join this consumer group (its members share the partitions), start "
              "from its committed offsets and commit what is printed.")
@click.option("--isolation", type=click.Choice(["read_uncommitted", "read_committed"]), default="read_uncommitted",
              show_default=True, help="read_committed: only committed transactions' records, up to the last "
              "stable offset.")
@click.option("--format", "fmt", default="text", show_default=True, metavar="text|json|TEMPLATE",
              help="text: values; json: one object per record; or a template such as '%k=%v\\n'.")
@click.option("--share-group", help="Read as a member of this share group (KIP-932): consoles of one share "
              "group share the records, each printed by one of them.")
@connection_options
def consume(topic, partitions, start, num, exit_at_end, group, isolation, fmt, share_group, target: Target) -> None:
    """Print TOPIC's records."""
    num = num or None
    if share_group and (partitions or group or exit_at_end or start != "start"):
        raise CommandError("--share-group: the share group decides what each member reads "
                           "(no -p, -o, -g or -e)", USAGE)
    where = _start(start)
    if group and not partitions and where[0] not in ("start", "end"):
        raise CommandError(f"-o {start}: with -g the group's committed offsets say where to start; -o takes "
                           "start or end (for partitions without one). Move the group with "
                           "`oncelog group seek`", USAGE)
    render = _formatter(fmt)
    if fmt not in ("text", "json") and not _TEMPLATE.search(fmt.encode()):
        raise CommandError(f"--format {fmt!r}: text, json, or a template with %t %p %o %k %v %T %h", USAGE)
    out = sys.stdout.buffer
    try:
        if share_group:
            run(target, _share_consume(target, topic, share_group, num, render, out))
        else:
            run(target, _consume(target, topic, partitions, where, num, exit_at_end, group, isolation, render, out))
    except BrokenPipeError:
        sys.stderr.close()   # `| head`: quietly, as other tools stop when their reader has gone
        sys.exit(0)


async def _consume(target: Target, topic, partitions, where, num, exit_at_end, group, isolation, render,
                   out) -> None:
    from oncelog.client.aio.admin import AIOAdminClient
    from oncelog.client.aio.consumer import AIOConsumer
    from oncelog.client.types import EARLIEST, LATEST, TopicPartition
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    config = target.config(**{"client.id": "oncelog-cli-consumer", "isolation.level": isolation,
                              "auto.offset.reset": "latest" if where[0] == "end" else "earliest"})
    member = bool(group) and not partitions
    if member:
        config.update({"group.id": group, "enable.auto.commit": "true"})
    async with AIOAdminClient(config) as admin, AIOConsumer(config) as consumer:
        count = len(await admin.describe_partitions(topic))
        missing = sorted(p for p in partitions if p >= count)
        if missing:
            raise CommandError(f"topic {topic} has {count} partitions: no partition {missing[0]}", USAGE)
        tps = [TopicPartition(topic, p) for p in (partitions or range(count))]
        if member:
            await _consume_in_group(consumer, topic, tps, num, exit_at_end, render, out, stop)
            return
        kind, n = where
        if kind == "start":
            positions = await consumer.list_offsets(tps, EARLIEST)
        elif kind == "end":
            positions = await consumer.list_offsets(tps, LATEST)
        elif kind == "time":
            found = await consumer.list_offsets(tps, n)
            ends = await consumer.list_offsets(tps, LATEST)
            positions = {tp: ends[tp] if found[tp] is None else found[tp] for tp in tps}
        else:
            positions = dict.fromkeys(tps, n)
        if group:
            committed = await admin.list_group_offsets(group)
            positions.update({tp: off for tp, off in committed.items() if tp in positions})
        consumer.assign([TopicPartition(tp.topic, tp.partition, positions[tp]) for tp in tps])
        ends = await consumer.list_offsets(tps, LATEST) if exit_at_end else {}
        printed = 0
        done: dict = {}

        async def commit() -> None:
            if group and done:
                await admin.alter_group_offsets(group, dict(done))

        try:
            while not stop.is_set() and (num is None or printed < num):
                if exit_at_end and all((consumer.position(tp) or 0) >= (ends[tp] or 0) for tp in tps):
                    break
                records = await _poll_or_stop(consumer.poll(0.5, None if num is None else num - printed), stop)
                if records is None:
                    break
                for r in records:
                    out.write(render(r))
                    done[TopicPartition(r.topic, r.partition)] = r.offset + 1
                printed += len(records)
                out.flush()
                if records:
                    await commit()
        finally:
            await commit()


async def _poll_or_stop(poll, stop: asyncio.Event) -> list | None:
    """The records of one poll, or None when Ctrl-C / SIGTERM came first (the poll cancelled)."""
    polled, stopped = asyncio.ensure_future(poll), asyncio.ensure_future(stop.wait())
    await asyncio.wait([polled, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not polled.done():
        polled.cancel()
        return None
    return polled.result()


async def _consume_in_group(consumer, topic, tps, num, exit_at_end, render, out, stop) -> None:
    """A member of the group: the coordinator assigns its share of the partitions; what it prints
    is committed after each poll (and by the consumer's auto-commit, and when it leaves)."""
    from oncelog.client.errors import KafkaClientError
    from oncelog.client.types import LATEST, TopicPartition
    consumer.subscribe([topic])
    ends = await consumer.list_offsets(tps, LATEST) if exit_at_end else {}
    printed = 0
    while not stop.is_set() and (num is None or printed < num):
        if exit_at_end:
            mine = [TopicPartition(tp.topic, tp.partition) for tp in consumer.assignment()]
            if mine and all((consumer.position(tp) or 0) >= (ends.get(tp) or 0) for tp in mine):
                break
        records = await _poll_or_stop(consumer.poll(0.5, None if num is None else num - printed), stop)
        if records is None:
            break
        for r in records:
            out.write(render(r))
        printed += len(records)
        out.flush()
        if records:
            try:
                await consumer.commit()
            except KafkaClientError:
                pass   # a rebalance under way: the partitions' revocation commits them


async def _share_consume(target: Target, topic: str, group: str, num, render, out) -> None:
    from oncelog.client.aio.share_consumer import AIOShareConsumer
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    config = target.config(**{"client.id": "oncelog-cli-share-consumer", "group.id": group,
                              "share.acknowledgement.mode": "explicit",
                              "max.poll.records": 500 if num is None else min(500, num)})
    async with AIOShareConsumer(config) as consumer:
        consumer.subscribe([topic])
        printed = 0
        while not stop.is_set() and (num is None or printed < num):
            polled = await _poll_or_stop(consumer.poll(0.5), stop)
            if polled is None:
                break
            for r in polled:
                if num is not None and printed >= num:
                    consumer.acknowledge(r, 2)   # RELEASE: not printed, for the others
                    continue
                out.write(render(r))
                consumer.acknowledge(r, 1)       # ACCEPT: printed
                printed += 1
            out.flush()
