"""Exactly-once writes: one transaction per write task, prepared by the task and completed by the
driver (Flink's KafkaSink; what SPARK-28908 proposed for Spark's Kafka sink).

A task opens a transactional producer with `transactional.id = <prefix>-<task partition id>`
(batch writes; its InitProducerId fences every earlier attempt of the same task, whose open
transaction the coordinator aborts: a failed attempt, a zombie whose input was cut short
(docs/spark.md, "A task cannot know that it succeeded"), a speculative twin). Streaming writes
give every attempt an id of its own and abort the others' transactions from the driver
(stream_transactions). The task produces its rows (and, streaming, its marker) in the
transaction, flushes, and hands the driver `TxnHandle(transactional id, producer id, epoch)` in
its commit message **without committing**: its input may have been cut short without an
error. Only the driver, which receives the messages of the attempts Spark counted, ends the
transactions: `Producer.resume_transaction` + EndTxn(commit) at the stored epoch, or abort. A
fenced attempt can never commit (its epoch is stale), so its rows are never visible to
read_committed readers.

The transaction timeout (`transaction.timeout.ms`, the sink's option `kafka.transaction.timeout.ms`)
must outlast a whole micro-batch or job, since the transactions wait for the driver: default
15 minutes (Kafka's default `transaction.max.timeout.ms`), lowered to the broker's
`transaction.max.timeout.ms` when that is smaller."""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from oncelog.client import AdminClient, Producer
from oncelog.client.errors import KafkaClientError, ProducerFencedError
from oncelog.protocol.errors import ErrorCode
from oncelog.spark.options import OncelogSparkError
from oncelog.spark.producers import WRITER_DEFAULTS

log = logging.getLogger("oncelog.spark")

DEFAULT_TIMEOUT_MS = 900_000
_broker_max: dict[str, int | None] = {}


@dataclass(frozen=True)
class TxnHandle:
    """What the driver needs to end a task's transaction. Picklable (in a commit message)."""
    transactional_id: str
    producer_id: int
    producer_epoch: int


def transaction_timeout(client: dict) -> dict:
    """`client` with the transaction timeout the sink uses: the user's
    `kafka.transaction.timeout.ms`, else 15 minutes capped by the broker's
    `transaction.max.timeout.ms` (read once per process with DescribeConfigs; a broker that
    does not answer leaves the default, and a refusal names the option to set)."""
    if "transaction.timeout.ms" in client:
        return client
    servers = str(client["bootstrap.servers"])
    if servers not in _broker_max:
        try:
            with AdminClient(dict(client)) as admin:
                raw = admin.describe_broker_configs(None, ["transaction.max.timeout.ms"]).get(
                    "transaction.max.timeout.ms")
            _broker_max[servers] = int(raw) if raw else None
        except Exception as e:  # noqa: BLE001 - a broker that hides its config: keep the default
            log.info("cannot read transaction.max.timeout.ms from %s (%r); using %d ms",
                     servers, e, DEFAULT_TIMEOUT_MS)
            _broker_max[servers] = None
    cap = _broker_max[servers]
    timeout = DEFAULT_TIMEOUT_MS if cap is None else min(DEFAULT_TIMEOUT_MS, cap)
    return {**client, "transaction.timeout.ms": str(timeout)}


def _config(client: dict, transactional_id: str) -> dict:
    return {**WRITER_DEFAULTS, **client, "transactional.id": transactional_id,
            "enable.idempotence": "true", "acks": "all"}


def open_transaction(client: dict, transactional_id: str) -> Producer:
    """A task's transactional producer, with earlier attempts fenced and a transaction begun."""
    try:
        producer = Producer(_config(client, transactional_id))
    except Exception as e:  # noqa: BLE001
        raise OncelogSparkError(
            f"cannot start a producer for bootstrap.servers={client['bootstrap.servers']!r} "
            f"({type(e).__name__}: {e}); check that the broker is running and reachable") from e
    try:
        producer.init_transactions(60)
        producer.begin_transaction()
    except KafkaClientError as e:
        producer.close(5)
        if getattr(e, "code", None) == ErrorCode.INVALID_TRANSACTION_TIMEOUT:
            raise OncelogSparkError(
                f"the broker refuses transaction.timeout.ms={client.get('transaction.timeout.ms')}"
                ": set the option kafka.transaction.timeout.ms at most its "
                "transaction.max.timeout.ms (and longer than a micro-batch takes)") from e
        raise
    except BaseException:
        producer.close(5)
        raise
    return producer


def hand_over(producer: Producer) -> TxnHandle:
    """After the task's records were all acknowledged: its transaction, left open for the
    driver. Closing the producer sends no EndTxn."""
    pid, epoch = producer.transaction_ids
    handle = TxnHandle(str(producer.config.transactional_id), pid, epoch)
    producer.close(10)
    return handle


def drop(producer: Producer) -> None:
    """A task that fails or skips: abort its transaction now rather than leave it open (it
    would hold back the last stable offset of its partitions until fenced or timed out)."""
    try:
        producer.abort_transaction(30)
    except Exception as e:  # noqa: BLE001 - fenced or unreachable: the next attempt fences it
        log.info("could not abort transaction %s: %r", producer.config.transactional_id, e)
    finally:
        producer.close(5)


def end(client: dict, handle: TxnHandle, commit: bool) -> None:
    """EndTxn for a task's transaction from the driver, at the epoch the task had. A commit the
    coordinator already completed at that epoch answers NONE (a retry); one aborted meanwhile
    or fenced by a later InitProducerId raises (KafkaClientError)."""
    with Producer(_config(client, handle.transactional_id)) as p:
        p.resume_transaction(handle.producer_id, handle.producer_epoch)
        (p.commit_transaction if commit else p.abort_transaction)(60)


def end_all(client: dict, handles: list[TxnHandle], commit: bool) -> dict[TxnHandle, Exception]:
    """`end` for each handle (concurrently: one round trip to the coordinator each); the
    handles that failed, with their errors."""
    if not handles:
        return {}

    def one(h: TxnHandle) -> Exception | None:
        try:
            end(client, h, commit)
            return None
        except Exception as e:  # noqa: BLE001 - returned for the caller to judge
            return e

    with ThreadPoolExecutor(min(8, len(handles)), thread_name_prefix="oncelog-endtxn") as pool:
        outcomes = list(pool.map(one, handles))
    return {h: e for h, e in zip(handles, outcomes) if e is not None}


def cannot_commit(e: BaseException) -> bool:
    """An EndTxn(commit) answer saying the transaction was aborted (by the timeout sweeper or a
    later InitProducerId) and never will commit; other errors leave its outcome open."""
    return isinstance(e, ProducerFencedError) or getattr(e, "code", None) in (
        ErrorCode.INVALID_TXN_STATE, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED)


def ongoing(client: dict) -> list[str]:
    """Transactional ids with a transaction open anywhere in the cluster (ListTransactions to
    every broker, state Ongoing): only those this client may DESCRIBE."""
    with AdminClient(dict(client)) as admin:
        return [t["transactional_id"] for t in admin.list_transactions(["Ongoing"])]


def fence(client: dict, transactional_ids: list[str]) -> None:
    """InitProducerId for each id: aborts what an attempt Spark gave up on left open (a task
    that failed every attempt leaves its last transaction open until the timeout otherwise,
    holding back read_committed readers of its partitions). Best effort."""
    def one(tid: str) -> None:
        try:
            with Producer(_config(client, tid)) as p:
                p.init_transactions(60)
        except Exception as e:  # noqa: BLE001 - the timeout sweeper aborts it in the end
            log.warning("could not fence transactional id %s: %r", tid, e)

    if transactional_ids:
        with ThreadPoolExecutor(min(8, len(transactional_ids)),
                                thread_name_prefix="oncelog-fence") as pool:
            list(pool.map(one, transactional_ids))
