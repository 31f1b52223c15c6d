"""The exactly-once streaming sink's transactions across driver deaths and replays: their ids,
the driver's decision, and the abort of those nobody will commit.

Ids are `<sinkId>-<batch>-<execution>-<task>-<task attempt id>`. `execution` is made by the
driver each time it plans the batch's write (a restart from the checkpoint makes a new one):
twelve hex digits of its clock in milliseconds, then four random ones, so that a task tells the
transactions of an earlier execution of its batch (a dead driver's) from its own execution's.
Every attempt has its own id: no attempt fences another, so nothing but this module and the
coordinator's timeout ever aborts a task's transaction once the driver relies on it.

The driver's commit of batch b (Flink's checkpointed committables; a two-phase coordinator's
decision record):
1. unless the marker topic already holds a decision for b, it records one: the transactions of
   the attempts Spark counted, oldest first, acknowledged (fsynced) before any is committed;
2. it commits them in that order, the oldest alone first: if that one can no longer commit
   (aborted by the timeout sweeper), none is visible, and the decision is voided so that a
   replay writes the batch anew; once it committed, the younger ones outlive it;
3. it aborts every other open transaction of the sink (lingering ones: a dead driver's, a
   vanished task's, a failed or zombie attempt's) and marks the batch committed.
A replay of b whose decision stands writes nothing: its tasks skip, and its driver commits the
recorded transactions (a commit completed already is answered NONE). So the rows visible for b
are the decision's, whatever Spark replays, however the replay splits the batch, wherever the
driver died.

Lingering transactions are also aborted when a batch starts (its task 0): those of earlier
executions that no decision lists, and those of earlier batches of this execution; a zombie of an
older execution (a task or a driver) never aborts a newer execution's transactions (the clock
orders them).

Two-phase commit (KIP-939, where the broker enables it; transactions.two_phase): the task
transactions are prepared and never time out, so step 2 needs no order and no void: the driver
completes every transaction of the decision (init_transactions(keep_prepared_txn=True), then
complete_transaction with the recorded state), after any crash, at any point, with any downtime;
a transaction no longer open was completed before (its task marker proves the commit).
Decisions are the driver's records (produce.py: written in transactions of the sink's driver
transactional id, which fences a zombie driver; the first decision of a batch stands)."""
from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable

from oncelog.client.errors import ProducerFencedError, TransactionFatalError
from oncelog.spark import produce, producers, transactions
from oncelog.spark.options import OncelogSparkError
from oncelog.spark.produce import Decision, Markers
from oncelog.spark.transactions import TxnHandle

log = logging.getLogger("oncelog.spark")

_ID = re.compile(r"(\d+)-([0-9a-f]{16})-\d+-\d+")


def new_execution() -> str:
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(2)}"


def transactional_id(sink: str, batch: int, execution: str, task: int, attempt_id: int) -> str:
    return f"{sink}-{batch}-{execution}-{task}-{attempt_id}"


def _parse(sink: str, tid: str) -> tuple[int, str] | None:
    """(batch, execution's clock) of one of this sink's ids, else None (another sink's ids
    never parse: a sink id that extends this one leaves more fields)."""
    if not tid.startswith(sink + "-"):
        return None
    m = _ID.fullmatch(tid, len(sink) + 1)
    return None if m is None else (int(m[1]), m[2][:12])


def _abort_lingering(client: dict, sink: str,
                     lingering: Callable[[str, int, str], bool]) -> list[str]:
    """Fences (InitProducerId: aborts) this sink's open transactions for which
    lingering(id, batch, execution clock) holds; returns their ids. Best effort: without
    ListTransactions they stay open until transaction.timeout.ms."""
    try:
        open_ids = transactions.ongoing(client)
    except Exception as e:  # noqa: BLE001 - readers wait for the timeout then; say so
        log.warning("oncelog sink %s: cannot list open transactions (%r); transactions a dead "
                    "driver or a vanished task left open stay open until "
                    "transaction.timeout.ms", sink, e)
        return []
    found = [tid for tid in open_ids
             if (parsed := _parse(sink, tid)) is not None and lingering(tid, *parsed)]
    if found:
        log.info("oncelog sink %s: aborting %d lingering transaction(s): %s", sink, len(found),
                 ", ".join(found))
        transactions.fence(client, found)
    return found


def _older(execution: str, batch: int) -> Callable[[str, int, str], bool]:
    """Transactions a driver or task of `execution` at `batch` may abort (if no decision lists
    them): an older execution's, or its own execution's up to this batch; never a newer one's."""
    clock = execution[:12]
    return lambda tid, b, ex: ex < clock or (ex == clock and b <= batch)


def abort_before_batch(client: dict, sink: str, batch: int, execution: str,
                       markers: Markers) -> list[str]:
    """At the start of a batch (its task 0): abort what earlier executions and earlier batches
    of this execution left open, except the transactions a decision lists."""
    keep = set().union(*(d.ids for d in markers.decisions.values()))
    clock = execution[:12]
    return _abort_lingering(client, sink, lambda tid, b, ex: tid not in keep and (
        ex < clock or (ex == clock and b < batch)))


def commit_batch(client: dict, topic: str, sink: str, batch: int, offered: list[TxnHandle],
                 rows: int, crash_after: int | None = None, *, execution: str = "f" * 16,
                 two_phase: bool = False, block: Callable[[int], None] | None = None,
                 driver: tuple[int, int] | None = None) -> None:
    """The driver's commit of a batch whose tasks handed over `offered` (oldest first): see the
    module's docstring. Raises when the batch cannot be completed now (Spark then calls abort()
    and the query fails; a restart replays the batch). `crash_after` (a test hook): commit that
    many transactions of the decision and raise, as a driver dying there would. `block` (a test
    hook): called with -1 before the decision is recorded, then with the number of transactions
    completed so far after each (one at a time then), for a test to stop the driver there."""
    markers = produce.scan_markers(client, topic, sink, batch)
    older = _older(execution, batch)
    if batch in markers.batches:
        # a replay after the driver marked the batch, before Spark's commit log
        _abort_lingering(client, sink, older)
        return
    decision = markers.decisions.get(batch)
    if decision is None:
        if block is not None:
            block(-1)
        mine = Decision(offered, rows)
        _write(client, sink, lambda p: produce.write_decision(p, topic, sink, batch, mine), driver)
        # the first decision of a batch stands: another driver of the sink (a zombie, or one of
        # a query started twice) may have recorded one first
        decision = produce.scan_markers(client, topic, sink, batch).decisions.get(batch, mine)
        if decision.ids != mine.ids:
            log.warning("oncelog sink %s: batch %d was decided by another driver first; completing "
                        "its %d transaction(s) and aborting this driver's", sink, batch,
                        len(decision.handles))
    else:
        log.info("oncelog sink %s: batch %d replayed; completing the %d transaction(s) its "
                 "driver recorded", sink, batch, len(decision.handles))
    if crash_after is not None:
        _complete(client, topic, sink, batch, decision.handles[:crash_after], two_phase, driver=driver)
        raise OncelogSparkError(f"injected driver crash in commit of batch {batch} after "
                                f"{crash_after} transaction(s) (option _crashInCommit)")
    _complete(client, topic, sink, batch, decision.handles, two_phase, block, driver)
    kept = decision.ids
    _abort_lingering(client, sink, lambda tid, b, ex: older(tid, b, ex) and tid not in kept)
    _write(client, sink, lambda p: produce.write_markers(p, topic, sink, batch,
                                                         {None: (decision.rows, None)}), driver)


def abort_batch(client: dict, topic: str, sink: str, batch: int,
                offered: list[TxnHandle], *, execution: str = "f" * 16, two_phase: bool = False) -> None:
    """The driver's abort of a batch (its job failed, or commit() raised): every open
    transaction of the sink up to this batch (of this or older executions) is aborted, except
    those of a recorded decision, which the replay commits."""
    try:
        markers = produce.scan_markers(client, topic, sink, batch)
    except Exception as e:  # noqa: BLE001 - a decision may stand: leave them to the replay
        log.warning("oncelog sink %s: batch %d aborted, but the marker topic cannot be read "
                    "(%r): its transactions stay open for the replay (or until "
                    "transaction.timeout.ms)", sink, batch, e)
        return
    keep = set().union(*(d.ids for d in markers.decisions.values()))
    stray = [h for h in offered if h.transactional_id not in keep]
    for h, err in transactions.end_all(client, stray, commit=False, two_phase=two_phase).items():
        log.info("oncelog sink %s: abort of %s: %r", sink, h.transactional_id, err)
    older = _older(execution, batch)
    _abort_lingering(client, sink, lambda tid, b, ex: older(tid, b, ex) and tid not in keep)


def _complete(client: dict, topic: str, sink: str, batch: int,
              handles: list[TxnHandle], two_phase: bool = False,
              block: Callable[[int], None] | None = None, driver: tuple[int, int] | None = None) -> None:
    """Commits the handles. Without two-phase commit the first alone first: while it has not
    committed, nothing of the batch is visible, and a first that can no longer commit voids the
    decision."""
    if not handles:
        return
    if two_phase or block is not None:
        _complete_prepared(client, topic, sink, batch, handles, block, two_phase)
        return
    first = handles[0]
    failed = _not_committed(client, topic, sink, batch,
                            transactions.end_all(client, [first], commit=True))
    if failed:
        e = failed[first]
        if transactions.cannot_commit(e):
            _write(client, sink, lambda p: produce.write_decision(p, topic, sink, batch, None), driver)
            raise OncelogSparkError(
                f"oncelog sink: batch {batch} must run again (restart the query): its "
                f"transaction {first.transactional_id} was aborted before the driver committed "
                f"it (did the batch take longer than kafka.transaction.timeout.ms?); nothing of "
                f"the batch is visible ({e})")
        raise OncelogSparkError(f"oncelog sink: cannot commit batch {batch} now "
                                f"({first.transactional_id}: {e!r}); restart the query to "
                                "complete it")
    failed = _not_committed(client, topic, sink, batch,
                            transactions.end_all(client, handles[1:], commit=True))
    lost = {h: e for h, e in failed.items() if transactions.cannot_commit(e)}
    if lost:
        # Without two-phase commit (a broker that does not enable it): the driver stopped in the
        # middle of its commit for longer than kafka.transaction.timeout.ms and the coordinator
        # aborted the rest. Failing every restart would not bring them back: say it, go on.
        log.error("oncelog sink %s: batch %d is partly committed: %d of its task transactions "
                  "were aborted by their timeout before the driver could commit them, their rows "
                  "are lost (enable transaction.two.phase.commit.enable on the broker to close "
                  "this window): %s", sink, batch, len(lost),
                  "; ".join(f"{h.transactional_id}: {e}" for h, e in lost.items()))
        failed = {h: e for h, e in failed.items() if h not in lost}
    if failed:
        raise OncelogSparkError(
            f"oncelog sink: cannot commit batch {batch} now; restart the query to complete it: "
            + "; ".join(f"{h.transactional_id}: {e!r}" for h, e in failed.items()))


def _complete_prepared(client: dict, topic: str, sink: str, batch: int, handles: list[TxnHandle],
                       block: Callable[[int], None] | None, two_phase: bool = True) -> None:
    """Two-phase commit: every prepared transaction of the decision is completed (kept with
    keepPreparedTxn, committed when it is the recorded one); none can have been aborted by a
    timeout, so nothing is voided and nothing is lost to a driver's downtime. One no longer
    open was completed before (by this driver before it died): its committed task marker says
    so. Without that proof it was aborted by hand (kafka-transactions abort, `oncelog
    transactions abort`): its rows are gone, which is said loudly, and the query goes on."""
    if block is None:
        failed = transactions.end_all(client, handles, commit=True, two_phase=True)
    else:   # a test's hook: one at a time, so that it can stop the driver between two
        failed = {}
        for i, h in enumerate(handles):
            failed.update(transactions.end_all(client, [h], commit=True, two_phase=two_phase))
            block(i + 1)
    failed = _not_committed(client, topic, sink, batch, failed)
    lost = {h: e for h, e in failed.items() if isinstance(e, transactions.NoOpenTransaction)
            or (not two_phase and transactions.cannot_commit(e))}
    if lost:
        log.error("oncelog sink %s: batch %d: %d prepared task transaction(s) were aborted by "
                  "someone other than this sink before its driver could complete them: their rows "
                  "are not visible: %s", sink, batch, len(lost),
                  "; ".join(f"{h.transactional_id}: {e}" for h, e in lost.items()))
    failed = {h: e for h, e in failed.items() if h not in lost}
    if failed:
        raise OncelogSparkError(
            f"oncelog sink: cannot complete batch {batch} now; restart the query to complete it "
            "(its prepared transactions wait for it, however long): "
            + "; ".join(f"{h.transactional_id}: {e!r}" for h, e in failed.items()))


def _not_committed(client: dict, topic: str, sink: str, batch: int,
                   failed: dict[TxnHandle, Exception]) -> dict[TxnHandle, Exception]:
    """The failed commits whose task marker is not committed either (a commit that completed
    before an error answered it is)."""
    if not failed:
        return failed
    done = produce.scan_markers(client, topic, sink, batch).transactions
    return {h: e for h, e in failed.items() if (h.producer_id, h.producer_epoch) not in done}


def _write(client: dict, sink: str, append: Callable, driver: tuple[int, int] | None = None) -> None:
    """`append` the driver's records in one transaction of the sink's driver transactional id
    (`driver`: the producer id and epoch its start got, producers.start_driver): counted by
    readers only once committed, and refused (PRODUCER_FENCED) once another driver of the sink
    started (this one is then a zombie and must stop)."""
    try:
        with producers.driver(client, sink, driver) as producer:
            producer.begin_transaction()
            append(producer)
            producer.commit_transaction(60)
    except (ProducerFencedError, TransactionFatalError) as e:
        raise OncelogSparkError(f"oncelog sink {sink}: another driver of this sink started (this "
                                f"one was fenced: {e}); stop this query") from e
