"""`oncelog produce`: a record per line of stdin (kafka-console-producer, `rpk topic produce`),
through the idempotent producer; it exits once every record is acknowledged, or says how many
were not. With --transactional-id every line goes into one transaction, committed at the end
of the input (aborted if anything fails or the command is interrupted)."""
from __future__ import annotations

import json
import sys
import threading

import click

from oncelog.cli.connect import (
    REFUSED,
    USAGE,
    CommandError,
    Target,
    connection_options,
    parse_assignments,
    reporting,
)


class _Outcomes:
    """Delivery reports, counted on the producer's thread."""

    def __init__(self, echo_json: bool) -> None:
        self.lock = threading.Lock()
        self.acknowledged = 0
        self.failed = 0
        self.first_error: BaseException | None = None
        self.echo_json = echo_json

    def __call__(self, err, meta) -> None:
        with self.lock:
            if err is not None:
                self.failed += 1
                self.first_error = self.first_error or err
                return
            self.acknowledged += 1
            if self.echo_json:
                click.echo(json.dumps({"topic": meta.topic, "partition": meta.partition, "offset": meta.offset,
                                       "timestamp": meta.timestamp}))


def _show_retries() -> None:
    """The producer's retries, with the error each was answered (KAFKA_STORAGE_ERROR of a full
    disk, NOT_LEADER_OR_FOLLOWER ...), on stderr even without --log-level, as Java's console
    producer shows them: a command that waits on them would otherwise look hung. The producer
    writes a few a minute."""
    import logging
    retries = logging.getLogger("oncelog.client.producer.retries")
    if not any(getattr(h, "_oncelog_produce", False) for h in retries.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("oncelog: %(message)s"))
        handler._oncelog_produce = True  # type: ignore[attr-defined]
        retries.addHandler(handler)
        retries.setLevel(logging.WARNING)
        retries.propagate = False


@click.command("produce")
@click.argument("topic")
@click.option("-k", "--key-separator", metavar="SEP",
              help="Each line is KEY<SEP>VALUE (kafka-console-producer's parse.key); a line without SEP is refused.")
@click.option("-p", "--partition", type=click.IntRange(0), help="Send every record to this partition.")
@click.option("-H", "--header", "headers", multiple=True, metavar="NAME=VALUE", help="A header on every record.")
@click.option("--transactional-id", metavar="ID", help="Produce all lines in one transaction under this id.")
@click.option("-X", "--producer-property", "properties", multiple=True, metavar="NAME=VALUE",
              help="A producer setting (repeatable), e.g. -X compression.type=zstd -X linger.ms=20.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: print each acknowledged record's topic, partition, offset and timestamp.")
@connection_options
def produce(topic, key_separator, partition, headers, transactional_id, properties, fmt, target: Target) -> None:
    """Send each line of stdin to TOPIC as a record."""
    if key_separator == "":
        raise CommandError("-k/--key-separator must not be empty", USAGE)
    header_items = tuple((k, v.encode()) for k, v in parse_assignments(headers, "-H").items())
    settings = {"enable.idempotence": "true", "acks": "all", "client.id": "oncelog-cli-producer",
                **parse_assignments(properties, "-X")}
    if transactional_id:
        settings["transactional.id"] = transactional_id
    outcomes = _Outcomes(fmt == "json")
    sent = 0
    _show_retries()
    with reporting(target):
        from oncelog.client import Producer
        producer = Producer(target.config(**settings))
        committed = False
        try:
            if transactional_id:
                producer.init_transactions()
                producer.begin_transaction()
            for lineno, line in enumerate(sys.stdin.buffer, 1):
                value = line.rstrip(b"\n").removesuffix(b"\r")
                key = None
                if key_separator is not None:
                    key, sep, value = value.partition(key_separator.encode())
                    if not sep:
                        raise CommandError(f"line {lineno} has no key separator {key_separator!r}"
                                           + (f" ({sent} records before it were sent)" if sent and not
                                              transactional_id else ""), USAGE)
                producer.produce(topic, value, key, partition=partition, headers=header_items or None,
                                 on_delivery=outcomes)
                sent += 1
            producer.flush()
            if transactional_id and not outcomes.failed:
                producer.commit_transaction()
                committed = True
        finally:
            if transactional_id and not committed and producer.fatal_error is None:
                try:
                    producer.abort_transaction()
                except Exception:  # noqa: BLE001 - the first failure is the one to report
                    pass
            producer.close()
    if outcomes.failed:
        raise CommandError(f"{outcomes.failed} of {sent} records were not acknowledged: {outcomes.first_error}",
                           REFUSED)
    if fmt == "text":
        click.echo(f"oncelog: {outcomes.acknowledged} records acknowledged by {topic}"
                   + (f" in transaction {transactional_id}" if transactional_id else ""), err=True)
