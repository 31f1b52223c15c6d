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
batches, and those of earlier executions of this batch that no decision lists; a zombie task of
an older execution never aborts a newer execution's transactions (the clock orders them)."""
from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable

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


def abort_before_batch(client: dict, sink: str, batch: int, execution: str,
                       markers: Markers) -> list[str]:
    """At the start of a batch (its task 0): abort what earlier batches and earlier executions
    of this batch left open, except the transactions a decision lists."""
    keep = set().union(*(d.ids for d in markers.decisions.values()))
    clock = execution[:12]
    return _abort_lingering(client, sink, lambda tid, b, ex: tid not in keep and (
        b < batch or (b == batch and ex < clock)))


def commit_batch(client: dict, topic: str, sink: str, batch: int, offered: list[TxnHandle],
                 rows: int, crash_after: int | None = None) -> None:
    """The driver's commit of a batch whose tasks handed over `offered` (oldest first): see the
    module's docstring. Raises when the batch cannot be completed now (Spark then calls abort()
    and the query fails; a restart replays the batch). `crash_after` (a test hook): commit that
    many transactions of the decision and raise, as a driver dying there would."""
    markers = produce.scan_markers(client, topic, sink, batch)
    if batch in markers.batches:
        # a replay after the driver marked the batch, before Spark's commit log
        _abort_lingering(client, sink, lambda tid, b, ex: b <= batch)
        return
    decision = markers.decisions.get(batch)
    if decision is None:
        decision = Decision(offered, rows)
        _write(client, lambda p: produce.write_decision(p, topic, sink, batch, decision))
    else:
        log.info("oncelog sink %s: batch %d replayed; completing the %d transaction(s) its "
                 "driver recorded", sink, batch, len(decision.handles))
    if crash_after is not None:
        _complete(client, topic, sink, batch, decision.handles[:crash_after])
        raise OncelogSparkError(f"injected driver crash in commit of batch {batch} after "
                                f"{crash_after} transaction(s) (option _crashInCommit)")
    _complete(client, topic, sink, batch, decision.handles)
    kept = decision.ids
    _abort_lingering(client, sink, lambda tid, b, ex: b <= batch and tid not in kept)
    _write(client, lambda p: produce.write_markers(p, topic, sink, batch,
                                                   {None: (decision.rows, None)}))


def abort_batch(client: dict, topic: str, sink: str, batch: int,
                offered: list[TxnHandle]) -> None:
    """The driver's abort of a batch (its job failed, or commit() raised): every open
    transaction of the sink up to this batch is aborted, except those of a recorded decision,
    which the replay commits."""
    try:
        markers = produce.scan_markers(client, topic, sink, batch)
    except Exception as e:  # noqa: BLE001 - a decision may stand: leave them to the replay
        log.warning("oncelog sink %s: batch %d aborted, but the marker topic cannot be read "
                    "(%r): its transactions stay open for the replay (or until "
                    "transaction.timeout.ms)", sink, batch, e)
        return
    decision = markers.decisions.get(batch)
    keep = decision.ids if decision is not None else set()
    stray = [h for h in offered if h.transactional_id not in keep]
    for h, err in transactions.end_all(client, stray, commit=False).items():
        log.info("oncelog sink %s: abort of %s: %r", sink, h.transactional_id, err)
    _abort_lingering(client, sink, lambda tid, b, ex: b <= batch and tid not in keep)


def _complete(client: dict, topic: str, sink: str, batch: int,
              handles: list[TxnHandle]) -> None:
    """Commits the handles, the first alone: while it has not committed, nothing of the batch
    is visible, and a first that can no longer commit voids the decision."""
    if not handles:
        return
    first = handles[0]
    failed = _not_committed(client, topic, sink, batch,
                            transactions.end_all(client, [first], commit=True))
    if failed:
        e = failed[first]
        if transactions.cannot_commit(e):
            _write(client, lambda p: produce.write_decision(p, topic, sink, batch, None))
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
        raise OncelogSparkError(
            f"oncelog sink: batch {batch} is partly committed and {len(lost)} of its task "
            "transactions were aborted before the driver could commit them (the driver "
            "stopped in the middle of its commit for longer than kafka.transaction.timeout.ms"
            "): their rows are lost: " + "; ".join(f"{h.transactional_id}: {e}"
                                                   for h, e in lost.items()))
    if failed:
        raise OncelogSparkError(
            f"oncelog sink: cannot commit batch {batch} now; restart the query to complete it: "
            + "; ".join(f"{h.transactional_id}: {e!r}" for h, e in failed.items()))


def _not_committed(client: dict, topic: str, sink: str, batch: int,
                   failed: dict[TxnHandle, Exception]) -> dict[TxnHandle, Exception]:
    """The failed commits whose task marker is not committed either (a commit that completed
    before an error answered it is)."""
    if not failed:
        return failed
    done = produce.scan_markers(client, topic, sink, batch).transactions
    return {h: e for h, e in failed.items() if (h.producer_id, h.producer_epoch) not in done}


def _write(client: dict, append: Callable) -> None:
    with producers.task_producer(client) as producer:
        append(producer)
