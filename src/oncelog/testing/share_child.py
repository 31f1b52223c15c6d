"""A share-group member in its own process, for `oncelog verify --workload share`
(`testing.share_verify`): kill -9 and SIGSTOP reach a whole client (its threads, its timers, what it
acquired) only when it is a process of its own.

The member is oncelog's `ShareConsumer` or confluent-kafka's (librdkafka's, in preview), in explicit
acknowledgement mode. It polls, decides for each record how to acknowledge it (`decide`: by the
record's value and delivery count, so that a run is the same for the same seed), optionally holds
what it acquired for a while (a member that is killed -9 in the middle, with records acquired),
acknowledges and commits. It writes what happened, one JSON line per event, to a file (each line
one write(2): a kill -9 leaves every line written before it), stamped with the machine's monotonic
clock, which every process of the run shares:

    ["poll", t]                               a poll begins
    ["got", t, partition, offset, count, value, poll_t]
                                              a record acquired for it, with its delivery count;
                                              poll_t: when the poll that returned it began
    ["ack", t, partition, offset, count, type] an acknowledgement sent (1 ACCEPT, 2 RELEASE, 3 REJECT)
    ["ackd", t, partition, offset, type, error]
                                              the broker's answer to it: error null = confirmed;
                                              otherwise its outcome is unknown
    ["reset", t]                              (oncelog) a share session was dropped during the call
                                              that began at t: what the member held went back
    ["error", t, text]
    ["fetch-errors", t, {code: n}]            (oncelog) the per-partition error codes of its
                                              ShareFetch answers so far, when they changed

Its standard input closing tells it to close the consumer (what it still holds goes back) and exit.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import zlib
from typing import Any

ACCEPT, RELEASE, REJECT = 1, 2, 3


def decide(policy: str, value: bytes, count: int, seed: int) -> int:
    """How a member of `policy` acknowledges a record. One record in 40 is "poison": every member
    releases it at every delivery, so it is archived at the delivery count limit. The sweeper
    that drains the group at the end accepts everything."""
    if policy == "sweep":
        return ACCEPT
    if zlib.crc32(value) % 40 == 0:
        return RELEASE
    if policy != "mixed":
        return ACCEPT
    r = zlib.crc32(value + b"/%d/%d" % (count, seed)) % 100
    return RELEASE if r < 12 else REJECT if r < 16 else ACCEPT


class Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.lock = threading.Lock()

    def __call__(self, *event: Any) -> None:
        line = (json.dumps(event) + "\n").encode()
        with self.lock:
            os.write(self.fd, line)


def _stdin_closed(stop: threading.Event) -> None:
    sys.stdin.read()
    stop.set()


def run_oncelog(spec: dict, log: Log, stop: threading.Event) -> None:
    from oncelog.client import ShareConsumer
    from oncelog.client.errors import KafkaClientError
    c = ShareConsumer({"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"],
                       "share.acknowledgement.mode": "explicit", "client.id": spec["name"],
                       # every record of a fetch is returned by the poll that fetched it: the
                       # poll's start is then a lower bound of its acquisition (the lock check)
                       "max.poll.records": 50, "fetch.max.wait.ms": 200, "request.timeout.ms": 5000})
    impl = c._impl
    joined = [False]
    heartbeat = impl._heartbeat

    async def watched(epoch: int) -> int:
        # a member that joins again (epoch 0 after the first join) gives back what it held
        if epoch == 0 and joined[0]:
            log("reset", time.monotonic())
        joined[0] = joined[0] or epoch == 0
        return await heartbeat(epoch)
    impl._heartbeat = watched
    fetched_in: dict[tuple[int, int], float] = {}   # records left in the client's buffer: the poll that fetched them
    errors_told: dict[int, int] = {}
    c.subscribe([spec["topic"]])
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            if dict(impl.fetch_errors) != errors_told:
                errors_told = dict(impl.fetch_errors)
                log("fetch-errors", t0, {str(k): v for k, v in errors_told.items()})
            log("poll", t0)
            before = dict(impl.sessions)
            try:
                records = c.poll(0.5)
            except KafkaClientError as e:
                log("error", time.monotonic(), f"poll: {e}")
                time.sleep(0.2)
                continue
            _sessions_kept(log, t0, before, impl.sessions)
            for r in records:
                fetched = fetched_in.pop((r.partition, r.offset), t0)
                log("got", time.monotonic(), r.partition, r.offset, r.delivery_count, (r.value or b"").decode(),
                    fetched)
            for r in impl.buffer:
                fetched_in.setdefault((r.partition, r.offset), t0)
            _hold(spec, records, stop)
            kinds = {}
            for r in records:
                kind = decide(spec["policy"], r.value or b"", r.delivery_count, spec["seed"])
                kinds[(r.partition, r.offset)] = kind
                c.acknowledge(r, kind)
                log("ack", time.monotonic(), r.partition, r.offset, r.delivery_count, kind)
            if kinds:
                _commit_oncelog(c, impl, log, kinds)
    finally:
        c.close()


def _sessions_kept(log: Log, t0: float, before: dict, after: dict) -> None:
    """A session epoch that went back (or a session gone) means the client opened a new share
    session: the broker gave back what the old one held."""
    if any(node not in after or after[node] < epoch for node, epoch in before.items()):
        log("reset", t0)


def _commit_oncelog(c, impl, log: Log, kinds: dict[tuple[int, int], int]) -> None:
    t0 = time.monotonic()
    before = dict(impl.sessions)
    left = dict(kinds)
    deadline = t0 + 10
    while left and time.monotonic() < deadline:
        try:
            results = c.commit_sync(15)
        except Exception as e:  # noqa: BLE001 - the outcome of what it carried is unknown
            log("error", time.monotonic(), f"commit_sync: {type(e).__name__}: {e}"[:300])
            for (p, o), kind in left.items():
                log("ackd", time.monotonic(), p, o, kind, f"{type(e).__name__}"[:100])
            _sessions_kept(log, t0, before, impl.sessions)
            return
        now = time.monotonic()
        for (p, o), kind in list(left.items()):
            code = next((v for (_t, part), v in results.items() if part == p), None)
            if code is None:
                continue   # its partition had no leader: still pending, sent by the next commit
            log("ackd", now, p, o, kind, None if code == 0 else f"error {code}")
            del left[(p, o)]
        if left:
            time.sleep(0.2)
    for (p, o), kind in left.items():
        log("ackd", time.monotonic(), p, o, kind, "never sent: no leader")
    _sessions_kept(log, t0, before, impl.sessions)


def run_librdkafka(spec: dict, log: Log, stop: threading.Event) -> None:
    from confluent_kafka import AcknowledgeType, KafkaException, ShareConsumer
    def on_commit(offsets, exc) -> None:
        now = time.monotonic()
        for tp, offs in offsets.items():
            for o in offs:
                kind = sent.pop((tp.partition, o), None)
                if kind is not None:
                    log("ackd", now, tp.partition, o, kind, None if exc is None else str(exc)[:100])

    sent: dict[tuple[int, int], int] = {}
    c = ShareConsumer({"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"],
                       "share.acknowledgement.mode": "explicit", "client.id": spec["name"],
                       "socket.timeout.ms": 5000, "log_level": 3})
    c.set_acknowledgement_commit_callback(on_commit)
    c.subscribe([spec["topic"]])
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            log("poll", t0)
            try:
                msgs = c.poll(0.5)
            except KafkaException as e:
                log("error", time.monotonic(), f"poll: {e}"[:300])
                time.sleep(0.2)
                continue
            records = []
            for m in msgs:
                if m.error():
                    log("error", time.monotonic(), str(m.error())[:300])
                    continue
                records.append(m)
                log("got", time.monotonic(), m.partition(), m.offset(), m.delivery_count(),
                    (m.value() or b"").decode(), t0)
            _hold(spec, records, stop)
            for m in records:
                kind = decide(spec["policy"], m.value() or b"", m.delivery_count() or 0, spec["seed"])
                c.acknowledge(m, AcknowledgeType(kind))
                sent[(m.partition() or 0, m.offset() or 0)] = kind
                log("ack", time.monotonic(), m.partition(), m.offset(), m.delivery_count(), kind)
            if records:
                try:
                    results = c.commit_sync(15)
                except KafkaException as e:
                    log("error", time.monotonic(), f"commit_sync: {e}"[:300])
                    continue   # unanswered: their outcome stays unknown (unless a callback tells it)
                now = time.monotonic()
                for tp, exc in (results or {}).items():   # what the callback has not told already
                    for (p, o), kind in list(sent.items()):
                        if p == tp.partition:
                            log("ackd", now, p, o, kind, None if exc is None else str(exc)[:100])
                            del sent[(p, o)]
    finally:
        c.close()


def _hold(spec: dict, records: list, stop: threading.Event) -> None:
    """A member that works slowly holds what it acquired for a while (a kill -9 then finds it
    holding records, and a pause of it can outlast their locks)."""
    if records and spec.get("hold_s"):
        stop.wait(spec["hold_s"])


def main(spec: dict) -> None:
    log = Log(spec["events"])
    stop = threading.Event()
    threading.Thread(target=_stdin_closed, args=(stop,), daemon=True).start()
    run = run_oncelog if spec["client"] == "oncelog" else run_librdkafka
    try:
        run(spec, log, stop)
    except Exception as e:  # noqa: BLE001 - the parent reports it; the events so far stand
        log("error", time.monotonic(), f"member crashed: {type(e).__name__}: {e}"[:300])
        raise


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
