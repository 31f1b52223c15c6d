"""Driver-side planning: which partitions a query reads, where it starts and ends, how the ranges
are split into Spark input partitions, and how a read limit is spread over partitions."""
from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from oncelog.client import Consumer, TopicPartition, config_keys
from oncelog.spark.options import EARLIEST, LATEST, OncelogSparkError, ReadOptions

T = TypeVar("T")


@dataclass(frozen=True)
class OffsetRange:
    """One Spark input partition: records [start, end) of topic-partition. Picklable."""
    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def connect(client: dict, role: str = "consumer") -> Consumer:
    cfg = config_keys.only(client, "consumer")   # a sink's producer settings are not the reader's
    cfg.setdefault("request.timeout.ms", "15000")
    cfg.setdefault("client.id", f"oncelog-spark-{role}")
    try:
        return Consumer(cfg)
    except OncelogSparkError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure here means "cannot reach the broker"
        raise OncelogSparkError(
            f"cannot reach the broker at bootstrap.servers={client['bootstrap.servers']!r} "
            f"({type(e).__name__}: {e}); check that it is running (oncelog serve) and that the "
            "address is reachable from the Spark driver and executors") from e


def topic_partitions(consumer: Consumer, ro: ReadOptions) -> list[tuple[str, int]]:
    topics = consumer.list_topics()
    if ro.subscribe is not None:
        missing = [t for t in ro.subscribe if t not in topics]
        if missing:
            raise OncelogSparkError(
                f"unknown topic(s) {', '.join(missing)} at {ro.client['bootstrap.servers']}; "
                f"create them first (oncelog admin / AdminClient.create_topics). Existing topics: "
                f"{', '.join(sorted(t for t in topics if not t.startswith('__'))) or '(none)'}")
        return sorted((t, p) for t in ro.subscribe for p in range(topics[t]))
    if ro.pattern is not None:
        rx = re.compile(ro.pattern)
        # internal topics ("__" prefix, e.g. the sink's commit markers) are never matched, as
        # Kafka's consumers exclude internal topics from pattern subscriptions
        return sorted((t, p) for t, n in topics.items()
                      if not t.startswith("__") and rx.fullmatch(t) for p in range(n))
    out = []
    for t, ps in (ro.assign or {}).items():
        if t not in topics:
            raise OncelogSparkError(f"unknown topic {t!r} in option assign; create it first")
        bad = [p for p in ps if p >= topics[t]]
        if bad:
            raise OncelogSparkError(f"option assign: topic {t!r} has {topics[t]} partition(s), "
                                    f"no partition {bad}")
        out += [(t, p) for p in ps]
    return sorted(out)


def retried(ro: ReadOptions, what: str, fetch: Callable[[], T]) -> T:
    """Spark's fetchOffset.numRetries / fetchOffset.retryIntervalMs: an offset lookup that fails
    is tried again that many times, that long apart, before the query fails with its error."""
    for attempt in range(ro.fetch_retries + 1):
        try:
            return fetch()
        except OncelogSparkError:
            raise
        except Exception as e:  # noqa: BLE001 - any client error; the last one is reported
            if attempt == ro.fetch_retries:
                raise OncelogSparkError(
                    f"{what} failed {attempt + 1} time(s) (fetchOffset.numRetries="
                    f"{ro.fetch_retries}): {type(e).__name__}: {e}") from e
            time.sleep(ro.fetch_retry_interval_ms / 1000)   # a backoff, not a wait for state
    raise AssertionError("unreachable")


def bounds(consumer: Consumer, tps: list[tuple[str, int]], ro: ReadOptions | None = None):
    """(earliest, latest) offsets of each partition."""
    if not tps:
        return {}, {}
    keys = [TopicPartition(t, p) for t, p in tps]
    if ro is not None:
        lo = retried(ro, "listing the earliest offsets", lambda: consumer.beginning_offsets(keys))
        hi = retried(ro, "listing the latest offsets", lambda: consumer.end_offsets(keys))
    else:
        lo = consumer.beginning_offsets(keys)
        hi = consumer.end_offsets(keys)
    return ({(k.topic, k.partition): lo.get(k) or 0 for k in keys},
            {(k.topic, k.partition): hi.get(k) or 0 for k in keys})


def resolve(position, tps, lo: dict, hi: dict, default_missing: int, option: str
            ) -> dict[str, dict[int, int]]:
    """startingOffsets/endingOffsets (earliest | latest | parsed JSON) -> concrete offsets."""
    out: dict[str, dict[int, int]] = {}
    for t, p in tps:
        if position == "earliest":
            want = EARLIEST
        elif position == "latest":
            want = LATEST
        else:
            want = position.get(t, {}).get(p, default_missing)
        if want == EARLIEST:
            off = lo[(t, p)]
        elif want == LATEST:
            off = hi[(t, p)]
        else:
            off = want
            if off > hi[(t, p)]:
                raise OncelogSparkError(
                    f"option {option}: offset {off} of {t}-{p} is beyond its end {hi[(t, p)]}")
        out.setdefault(t, {})[p] = off
    if isinstance(position, dict):
        known = {t: set(ps) for t, ps in out.items()}
        extra = [f"{t}-{p}" for t, ps in position.items() for p in ps if p not in known.get(t, ())]
        if extra:
            raise OncelogSparkError(f"option {option} names partitions this query does not read: "
                                    f"{', '.join(extra)}")
    return out


def by_timestamp(consumer: Consumer, ro: ReadOptions, times, tps, hi: dict, option: str,
                 strategy: str) -> dict[str, dict[int, int]]:
    """startingTimestamp / startingOffsetsByTimestamp / endingTimestamp / endingOffsetsByTimestamp
    -> offsets, as Spark's KafkaOffsetReader: each partition's earliest offset whose timestamp is
    at or after the time (ListOffsets by timestamp). Where no record is that recent, `strategy`
    says: "error" fails (Spark's default for starting times), "latest" takes the end offset
    (always so for ending times). A JSON of times must name every partition the query reads."""
    if isinstance(times, dict):
        named = {(t, p) for t, ps in times.items() for p in ps}
        missing = sorted(set(tps) - named)
        extra = sorted(named - set(tps))
        if missing or extra:
            raise OncelogSparkError(
                f"option {option} must name exactly the partitions this query reads"
                + (f"; missing {', '.join(f'{t}-{p}' for t, p in missing)}" if missing else "")
                + (f"; not read {', '.join(f'{t}-{p}' for t, p in extra)}" if extra else ""))
        wanted = {TopicPartition(t, p): times[t][p] for t, p in tps}
    else:
        wanted = {TopicPartition(t, p): times for t, p in tps}
    found = retried(ro, f"looking up offsets by time ({option})",
                    lambda: consumer.offsets_for_times(wanted) if wanted else {})
    out: dict[str, dict[int, int]] = {}
    for key, ts in wanted.items():
        off = found.get(key)
        if off is None or off < 0:
            if strategy == "error":
                raise OncelogSparkError(
                    f"option {option}: {key.topic}-{key.partition} has no record with a timestamp "
                    f"at or after {ts}; set startingOffsetsByTimestampStrategy=latest to start at "
                    "its end instead")
            off = hi[(key.topic, key.partition)]
        out.setdefault(key.topic, {})[key.partition] = off
    return out


def split(ranges: list[OffsetRange], min_partitions: int | None,
          max_records: int | None) -> list[OffsetRange]:
    """Spark's KafkaOffsetRangeCalculator idea: large ranges are cut into pieces so that there are
    at least `min_partitions` input partitions and none holds more than `max_records`."""
    ranges = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in ranges)
    if not ranges:
        return []
    out = []
    for r in ranges:
        pieces = 1
        if min_partitions and min_partitions > len(ranges):
            pieces = max(1, round(r.size * min_partitions / total))
        if max_records:
            pieces = max(pieces, math.ceil(r.size / max_records))
        pieces = min(pieces, r.size)
        step, rem = divmod(r.size, pieces)
        at = r.start
        for i in range(pieces):
            n = step + (1 if i < rem else 0)
            out.append(OffsetRange(r.topic, r.partition, at, at + n))
            at += n
    return out


def limit_rows(start: dict[str, dict[int, int]], latest: dict[str, dict[int, int]],
               max_rows: int) -> dict[str, dict[int, int]]:
    """Admit at most `max_rows` offsets, spread over partitions in proportion to what each has
    waiting (as Spark's maxOffsetsPerTrigger), the remainder going to the largest backlogs so the
    total is exactly min(max_rows, available)."""
    backlog = {(t, p): max(0, latest[t][p] - start.get(t, {}).get(p, latest[t][p]))
               for t in latest for p in latest[t]}
    total = sum(backlog.values())
    if total <= max_rows:
        return latest
    take = {k: (v * max_rows) // total for k, v in backlog.items()}
    left = max_rows - sum(take.values())
    for k in sorted(backlog, key=lambda k: (-(backlog[k] - take[k]), k)):
        if left == 0:
            break
        if take[k] < backlog[k]:
            take[k] += 1
            left -= 1
    out: dict[str, dict[int, int]] = {}
    for (t, p), n in take.items():
        out.setdefault(t, {})[p] = start.get(t, {}).get(p, latest[t][p]) + n
    return out
