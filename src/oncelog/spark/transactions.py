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
`transaction.max.timeout.ms` when that is smaller.

Two-phase commit (KIP-939; option `twoPhaseCommit`, by default wherever the broker enables
`transaction.two.phase.commit.enable`): the task's producer asks for Enable2Pc, so the
coordinator never aborts its transaction by timeout, and hands over the state
`prepare_transaction` returns; the driver completes it with `init_transactions(keep_prepared_txn=
True)` + `complete_transaction(state)`, which also fences the task (and any other producer of the
id). No window is left for the timeout: a driver may be down for any time."""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from oncelog.client import AdminClient, PreparedTxnState, Producer, config_keys
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
            with AdminClient(config_keys.only(client, "admin")) as admin:
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


TWO_PC = "transaction.two.phase.commit.enable"


class NoOpenTransaction(OncelogSparkError):
    """complete: the prepared transaction is no longer open (completed before, by this driver
    before it died or by another; or aborted by hand): the caller decides from its proof."""


def two_phase(client: dict, option: str) -> bool:
    """Whether task transactions use KIP-939's two-phase commit: option "true" (the broker must
    enable it), "false", or "auto": where the broker's transaction.two.phase.commit.enable is
    true (DescribeConfigs; Kafka's releases and brokers that hide it: no)."""
    if option == "false":
        return False
    try:
        with AdminClient(config_keys.only(client, "admin")) as admin:
            enabled = str(admin.describe_broker_configs(None, [TWO_PC]).get(TWO_PC)).lower() == "true"
    except Exception as e:  # noqa: BLE001 - a broker that hides its config: no 2PC
        log.info("cannot read %s from %s (%r)", TWO_PC, client.get("bootstrap.servers"), e)
        enabled = False
    if option == "true" and not enabled:
        raise OncelogSparkError(f"option twoPhaseCommit=true: the broker does not enable {TWO_PC}")
    if not enabled:
        log.warning("oncelog sink: the broker does not enable %s (KIP-939): task transactions are "
                    "aborted by the coordinator after kafka.transaction.timeout.ms, and a driver "
                    "down longer than that mid-commit loses the rows of the transactions it had "
                    "not committed (docs/spark.md)", TWO_PC)
    return enabled


def _config(client: dict, transactional_id: str, two_phase: bool = False) -> dict:
    config = {**WRITER_DEFAULTS, **config_keys.only(client, "producer"), "transactional.id": transactional_id,
              "enable.idempotence": "true", "acks": "all"}
    if two_phase:
        # Kafka's ProducerConfig refuses a timeout with 2PC: the coordinator never times it out
        config.pop("transaction.timeout.ms", None)
        config[TWO_PC] = "true"
    return config


def open_transaction(client: dict, transactional_id: str, two_phase: bool = False) -> Producer:
    """A task's transactional producer, with earlier attempts fenced and a transaction begun."""
    try:
        producer = Producer(_config(client, transactional_id, two_phase))
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
    driver (two-phase commit: prepared, its state the handle). Closing the producer sends no
    EndTxn."""
    if producer.config.two_phase_commit:
        try:
            state = producer.prepare_transaction(60)
        except BaseException:
            producer.close(5)
            raise
        handle = TxnHandle(str(producer.config.transactional_id), state.producer_id, state.epoch)
        producer.close(10)
        return handle
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


def end(client: dict, handle: TxnHandle, commit: bool, two_phase: bool = False) -> None:
    """EndTxn for a task's transaction from the driver, at the epoch the task had. A commit the
    coordinator already completed at that epoch answers NONE (a retry); one aborted meanwhile
    or fenced by a later InitProducerId raises (KafkaClientError).

    Two-phase commit: InitProducerId(keepPreparedTxn) keeps the prepared transaction (fencing
    the task and any other producer of the id) and names it; it is committed if it is the
    handle's, aborted otherwise; NoOpenTransaction when none is open any more."""
    if two_phase:
        with Producer(_config(client, handle.transactional_id, True)) as p:
            if not commit:
                p.init_transactions(60)   # keepPreparedTxn=false: the coordinator aborts it
                return
            p.init_transactions(60, keep_prepared_txn=True)
            outcome = p.complete_transaction(PreparedTxnState(handle.producer_id, handle.producer_epoch), 60)
            if outcome is None:
                raise NoOpenTransaction(f"{handle.transactional_id}: no prepared transaction is open")
            if outcome is False:
                raise NoOpenTransaction(f"{handle.transactional_id}: the open transaction is not the "
                                        f"recorded one ({handle.producer_id}:{handle.producer_epoch}); "
                                        "aborted it")
        return
    with Producer(_config(client, handle.transactional_id)) as p:
        p.resume_transaction(handle.producer_id, handle.producer_epoch)
        (p.commit_transaction if commit else p.abort_transaction)(60)


def end_all(client: dict, handles: list[TxnHandle], commit: bool,
            two_phase: bool = False) -> dict[TxnHandle, Exception]:
    """`end` for each handle (concurrently: one round trip to the coordinator each); the
    handles that failed, with their errors."""
    if not handles:
        return {}

    def one(h: TxnHandle) -> Exception | None:
        try:
            end(client, h, commit, two_phase)
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
    with AdminClient(config_keys.only(client, "admin")) as admin:
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
