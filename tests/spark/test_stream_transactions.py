"""The exactly-once stream sink's transactions without Spark (spark/stream_transactions.py):
which open transactions a batch's first task aborts, the driver's decision in the marker topic,
and a decision voided when its first transaction can no longer commit."""
from __future__ import annotations

import pytest
from test_exactly_once import client_values

from oncelog.client import AdminClient
from oncelog.spark import produce, stream_transactions, transactions
from oncelog.spark.options import OncelogSparkError

OLD, NOW, LATER = "000000000001aaaa", "000000000002bbbb", "000000000003cccc"


def _open(client, topic, tid):
    """A task's transaction with one row, left open as a task hands it over."""
    p = transactions.open_transaction(client, tid)
    p.send(topic, tid.encode(), partition=0)
    p.flush()
    return transactions.hand_over(p)


def _open_ids(bootstrap):
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        return {t["transactional_id"] for t in admin.list_transactions(["Ongoing"])}


def test_a_batch_start_aborts_what_earlier_batches_and_executions_left(spark_broker, make_topic):
    topic, markers = make_topic(1), make_topic(1)
    client = {"bootstrap.servers": spark_broker}
    tid = stream_transactions.transactional_id
    sink = f"sink-{topic}"
    lingering = {tid(sink, 3, OLD, 0, 7), tid(sink, 4, OLD, 2, 9), tid(sink, 4, OLD, 5, 10),
                 tid(sink, 5, OLD, 0, 13),   # a later batch of an older execution (fenced: it never decides)
                 tid(sink, 3, NOW, 0, 14)}   # an earlier batch of this execution
    kept = {
        tid(sink, 4, NOW, 0, 11),          # this execution's own tasks
        tid(sink, 4, LATER, 1, 12),        # a newer execution (this task is the zombie)
        tid(sink, 3, LATER, 1, 15),        # ...at any batch
        tid(sink, 4, OLD, 1, 8),           # recorded in a decision: the replay commits it
        tid(sink + "-2", 1, OLD, 0, 1),    # a sink whose id extends this one
        f"{sink}-4-0",                     # not an id of this sink's making
    }
    handles = {t: _open(client, topic, t) for t in lingering | kept}
    # the driver's records count in its own transactions only (a plain one would be ignored)
    stream_transactions._write(client, sink, lambda p: produce.write_decision(p, markers, sink, 4, produce.Decision(
        [handles[tid(sink, 4, OLD, 1, 8)]], 1)))
    found = produce.scan_markers(client, markers, sink, 4)
    assert found.decisions[4].ids == {tid(sink, 4, OLD, 1, 8)}

    aborted = stream_transactions.abort_before_batch(client, sink, 4, NOW, found)
    assert set(aborted) == lingering
    still_open = _open_ids(spark_broker)
    assert kept <= still_open and not lingering & still_open
    transactions.fence(client, sorted(kept))


def test_a_decision_whose_first_transaction_was_aborted_is_voided(spark_broker, make_topic):
    """The first transaction of a decision aborted before the driver commits it (as the
    timeout sweeper would): nothing of the batch is visible, so the decision is voided and the
    replay writes the batch anew; the others are aborted, not committed."""
    topic, markers = make_topic(1), make_topic(1)
    client = {"bootstrap.servers": spark_broker}
    sink = f"sink-{topic}"
    ids = [stream_transactions.transactional_id(sink, 0, NOW, t, t) for t in range(2)]
    handles = [_open(client, topic, t) for t in ids]
    transactions.fence(client, ids[:1])           # aborts the oldest
    with pytest.raises(OncelogSparkError, match="must run again"):
        stream_transactions.commit_batch(client, markers, sink, 0, handles, 2)
    found = produce.scan_markers(client, markers, sink, 0)
    assert 0 not in found.decisions and 0 not in found.batches
    stream_transactions.abort_batch(client, markers, sink, 0, handles)   # what Spark calls next
    assert not set(ids) & _open_ids(spark_broker)
    assert client_values(spark_broker, topic, 1, "read_committed") == []


def test_a_recorded_decision_is_completed_and_not_aborted(spark_broker, make_topic):
    """commit() dies after the decision (nothing committed): abort() leaves the recorded
    transactions open, and the replay's commit, offered nothing, commits them."""
    topic, markers = make_topic(1), make_topic(1)
    client = {"bootstrap.servers": spark_broker}
    sink = f"sink-{topic}"
    ids = [stream_transactions.transactional_id(sink, 2, OLD, t, t) for t in range(3)]
    handles = [_open(client, topic, t) for t in ids]
    with pytest.raises(OncelogSparkError, match="injected driver crash"):
        stream_transactions.commit_batch(client, markers, sink, 2, handles, 3, crash_after=0)
    stream_transactions.abort_batch(client, markers, sink, 2, handles)
    assert set(ids) <= _open_ids(spark_broker)
    stream_transactions.commit_batch(client, markers, sink, 2, [], 0)
    assert sorted(client_values(spark_broker, topic, 1, "read_committed")) == sorted(
        t.encode() for t in ids)
    assert 2 in produce.scan_markers(client, markers, sink, 2).batches
