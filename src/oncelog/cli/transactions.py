"""`oncelog transactions`: kafka-transactions.sh's list, describe, describe-producers and abort,
including aborting a hanging transaction (one open on a partition that its coordinator no longer
tracks: a producer gone without ending it, or a marker that never reached the partition) and
finding them (`find-hanging`, as kafka-transactions.sh); and KIP-939's operator needs: `list
--duration-filter` finds transactions open for long (a prepared two-phase-commit one nobody
completes holds its partitions' last stable offset), `complete`
commits or aborts a prepared one as its external transaction manager would, `abort
--transactional-id` aborts it."""
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


@click.group("transactions")
def transactions() -> None:
    """List, describe and abort transactions."""


@transactions.command("list")
@click.option("--state", "states", multiple=True, help="Only transactions in this state (repeatable; Kafka's "
              "names: Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, Empty, Dead).")
@click.option("--duration-filter", "duration_ms", type=click.IntRange(0), default=None,
              help="Only transactions running for longer than this many milliseconds (kafka-transactions.sh's "
              "option; ListTransactions v1).")
@format_option
@connection_options
def list_(states, duration_ms, fmt, target: Target) -> None:
    """Every transactional id the coordinators know, with its producer id and state."""
    async def go():
        async with admin_client(target) as admin:
            return await admin.list_transactions(list(states) or None, -1 if duration_ms is None else duration_ms)
    listed = sorted(run(target, go()), key=lambda t: t["transactional_id"])
    if fmt == "json":
        print_json(listed)
    else:
        print_table(["TRANSACTIONAL-ID", "PRODUCER-ID", "STATE"],
                    [[t["transactional_id"], t["producer_id"], t["state"]] for t in listed])


@transactions.command("describe")
@click.argument("transactional_id")
@format_option
@connection_options
def describe(transactional_id, fmt, target: Target) -> None:
    """A transactional id's state, producer, timeout and the partitions of its open transaction."""
    async def go():
        async with admin_client(target) as admin:
            return await admin.describe_transaction(transactional_id)
    d = run(target, go())
    out = {"transactional_id": d.transactional_id, "state": d.state, "producer_id": d.producer_id,
           "producer_epoch": d.producer_epoch, "timeout_ms": d.timeout_ms, "start_ms": d.start_ms,
           "partitions": [{"topic": tp.topic, "partition": tp.partition} for tp in d.partitions]}
    if fmt == "json":
        print_json(out)
        return
    print_table(["TRANSACTIONAL-ID", "STATE", "PRODUCER-ID", "EPOCH", "TIMEOUT-MS", "START-MS", "PARTITIONS"],
                [[d.transactional_id, d.state, d.producer_id, d.producer_epoch, d.timeout_ms,
                  "" if d.start_ms < 0 else d.start_ms, ",".join(f"{tp.topic}-{tp.partition}" for tp in d.partitions)]])


@transactions.command("describe-producers")
@click.option("--topic", required=True)
@click.option("--partition", type=click.IntRange(0), required=True)
@format_option
@connection_options
def describe_producers(topic, partition, fmt, target: Target) -> None:
    """The producers a partition's leader tracks, and where each one's open transaction starts."""
    async def go():
        from oncelog.client.types import TopicPartition
        async with admin_client(target) as admin:
            return await admin.partition_producers(TopicPartition(topic, partition))
    producers = run(target, go())
    rows = [p._asdict() for p in producers]
    if fmt == "json":
        print_json(rows)
        return
    print_table(["PRODUCER-ID", "EPOCH", "LAST-SEQUENCE", "LAST-TIMESTAMP", "COORDINATOR-EPOCH", "TXN-START-OFFSET"],
                [[p.producer_id, p.producer_epoch, p.last_sequence, p.last_timestamp, p.coordinator_epoch,
                  "-" if p.current_txn_start_offset < 0 else p.current_txn_start_offset] for p in producers])


@transactions.command("find-hanging")
@click.option("--topic", "topics", multiple=True, help="Look at this topic's partitions (repeatable).")
@click.option("--partition", "partitions", multiple=True, type=click.IntRange(0),
              help="Only this partition of the topic (repeatable).")
@click.option("--broker-id", type=int, default=None, help="Look at every partition this broker leads.")
@click.option("--max-transaction-timeout", "max_minutes", type=click.FloatRange(0), default=15.0,
              show_default=True, help="Minutes: a transaction open no longer than this may still end by itself "
              "(the brokers' transaction.max.timeout.ms), so it is not listed.")
@format_option
@connection_options
def find_hanging(topics, partitions, broker_id, max_minutes, fmt, target: Target) -> None:
    """Transactions open on a partition that their coordinator does not track (as kafka-transactions.sh
    find-hanging): DescribeProducers finds the open ones older than --max-transaction-timeout,
    ListTransactions and DescribeTransactions tell which the coordinators know; the rest hang, and
    `transactions abort --topic --partition --start-offset` ends them."""
    if bool(topics) == (broker_id is not None):
        raise CommandError("give --topic (with --partition) or --broker-id", USAGE)
    if partitions and len(topics) != 1:
        raise CommandError("--partition needs exactly one --topic", USAGE)

    async def go():
        import time

        from oncelog.client.aio.admin_base import AdminError
        from oncelog.client.types import TopicPartition
        async with admin_client(target) as admin:
            tps: list = []
            if broker_id is not None:
                for listing in await admin.topic_listings():
                    tps += [TopicPartition(listing.name, p.partition)
                            for p in await admin.describe_partitions(listing.name) if p.leader == broker_id]
            else:
                for t in topics:
                    found = await admin.describe_partitions(t)
                    missing = sorted(set(partitions) - {p.partition for p in found})
                    if missing:
                        raise CommandError(f"topic {t} has {len(found)} partitions: no partition {missing[0]}",
                                           USAGE)
                    tps += [TopicPartition(t, p.partition) for p in found
                            if not partitions or p.partition in partitions]
            now = int(time.time() * 1000)
            candidates = [(tp, p) for tp in tps for p in await admin.partition_producers(tp)
                          if p.current_txn_start_offset >= 0 and now - p.last_timestamp > max_minutes * 60_000]
            if not candidates:
                return []
            ids: dict[int, list[str]] = {}
            for t in await admin.list_transactions():
                ids.setdefault(int(t["producer_id"]), []).append(str(t["transactional_id"]))
            hanging = []
            for tp, p in candidates:
                tracked = False
                for tid in ids.get(p.producer_id, []):
                    try:
                        d = await admin.describe_transaction(tid)
                    except AdminError:
                        continue
                    if d.producer_id == p.producer_id and d.state not in ("Empty", "CompleteCommit",
                                                                          "CompleteAbort", "Dead") \
                            and TopicPartition(tp.topic, tp.partition) in d.partitions:
                        tracked = True
                if not tracked:
                    hanging.append({"topic": tp.topic, "partition": tp.partition, "producer_id": p.producer_id,
                                    "producer_epoch": p.producer_epoch, "coordinator_epoch": p.coordinator_epoch,
                                    "start_offset": p.current_txn_start_offset, "last_timestamp": p.last_timestamp,
                                    "duration_min": round((now - p.last_timestamp) / 60_000, 1)})
            return hanging
    rows = run(target, go())
    if fmt == "json":
        print_json(rows)
        return
    print_table(["TOPIC", "PARTITION", "PRODUCER-ID", "EPOCH", "COORDINATOR-EPOCH", "START-OFFSET",
                 "LAST-TIMESTAMP", "DURATION(MIN)"],
                [[r["topic"], r["partition"], r["producer_id"], r["producer_epoch"], r["coordinator_epoch"],
                  r["start_offset"], r["last_timestamp"], r["duration_min"]] for r in rows])


@transactions.command("abort")
@click.option("--transactional-id", help="Fence this id's producers: its open transaction is aborted by the "
              "coordinator, and the producer gets PRODUCER_FENCED on its next request.")
@click.option("--topic", help="With --partition, --start-offset and --credential-file: write an ABORT marker "
              "for the hanging transaction that starts there.")
@click.option("--partition", type=click.IntRange(0))
@click.option("--start-offset", type=click.IntRange(0),
              help="Where the hanging transaction starts (`transactions describe-producers`).")
@click.option("--credential-file", type=click.Path(dir_okay=False),
              help="The cluster credential (`<data dir>/cluster.credential`): only a broker of the cluster "
              "may write a transaction marker, so the hanging abort logs in as one.")
@connection_options
def abort(transactional_id, topic, partition, start_offset, credential_file, target: Target) -> None:
    """Abort a transaction: by transactional id, or a hanging one by partition and start offset."""
    hanging = (topic, partition, start_offset)
    if transactional_id and any(v is not None for v in (*hanging, credential_file)):
        raise CommandError("give --transactional-id, or --topic, --partition, --start-offset and "
                           "--credential-file, not both", USAGE)
    if not transactional_id and any(v is None for v in (*hanging, credential_file)):
        raise CommandError("give --transactional-id, or all of --topic, --partition, --start-offset and "
                           "--credential-file", USAGE)
    if credential_file:
        target = _as_broker(target, credential_file)

    async def go():
        from oncelog.client.types import TopicPartition
        async with admin_client(target) as admin:
            if transactional_id:
                pid, epoch = await admin.fence_transactional_id(transactional_id)
                return f"fenced {transactional_id}: its open transaction is aborted (producer {pid} epoch {epoch})"
            p = await admin.abort_hanging_transaction(TopicPartition(topic, partition), start_offset)
            return (f"aborted the transaction of producer {p.producer_id} (epoch {p.producer_epoch}) on "
                    f"{topic}-{partition} from offset {start_offset}")
    click.echo(run(target, go()))


@transactions.command("complete")
@click.option("--transactional-id", required=True)
@click.option("--prepared-state", required=True, help="The state the external transaction manager recorded "
              "(`<producer id>:<epoch>`, PreparedTxnState's form): the open transaction is committed if it is "
              "that one, aborted otherwise.")
@connection_options
def complete(transactional_id, prepared_state, target: Target) -> None:
    """Complete a prepared two-phase-commit transaction (KIP-939) by hand: keep it
    (InitProducerId with KeepPreparedTxn, which fences its producer), then commit it if it is the
    recorded one, else abort it. Needs TWO_PHASE_COMMIT and WRITE on the transactional id."""
    from oncelog.client import PreparedTxnState, Producer
    try:
        state = PreparedTxnState.parse(prepared_state)
    except ValueError as e:
        raise CommandError(f"--prepared-state: {e}", USAGE) from None
    config = target.config(**{"transactional.id": transactional_id, "transaction.two.phase.commit.enable": "true"})
    with Producer(config) as p:
        p.init_transactions(60, keep_prepared_txn=True)
        kept = p.prepared_transaction
        outcome = p.complete_transaction(state, 60)
    if outcome is None:
        click.echo(f"{transactional_id}: no prepared transaction is open (completed before)")
    elif outcome:
        click.echo(f"{transactional_id}: committed the prepared transaction {kept}")
    else:
        click.echo(f"{transactional_id}: the open transaction {kept} is not {state}: aborted it")


def _as_broker(target: Target, credential_file: str) -> Target:
    """The target's connection, logged in with the cluster credential (SCRAM-SHA-512; on a listener
    without SASL the broker takes it as the cluster login, on one with SASL as any login)."""
    from oncelog.storage import cluster_credential
    try:
        credential = cluster_credential.load(credential_file)
    except cluster_credential.CredentialFileError as e:
        raise CommandError(f"--credential-file: {e}", USAGE) from None
    protocol = str(target.settings.get("security.protocol", "PLAINTEXT")).upper()
    tls = protocol in ("SSL", "SASL_SSL")
    return Target(target.bootstrap, {**target.settings, "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
                                     "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": credential.username,
                                     "sasl.password": credential.password})
