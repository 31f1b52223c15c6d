"""Prometheus metrics: requests, bytes, latency and error codes per API; partitions, log sizes
and producer state per topic; connections per listener, consumer groups' committed offsets and
lag, transactions per state. Each Broker has its own registry so several brokers can share a
process (tests). docs/operations.md maps each metric to Kafka's JMX name.

Error codes are counted as Kafka's ErrorsPerSec counts them (every non-zero code of a response,
per partition or resource): Produce and Fetch by their handlers, from the partition answers they
build (their responses are the hot path and carry records); every other response by reading its
bytes back (`count_response_errors`), so no handler can forget one.

The broker's state (partitions, connections, groups, offsets, transactions) is read on the event
loop only: a scrape, on the endpoint's thread, asks the loop for a snapshot of plain values and
renders that (issue 36: scrapes used to read, and through the groups' listing change, the
coordinators' dicts from their own thread). Snapshots are taken at most once a second (a scrape
that comes sooner waits, on its own thread; scrapes at once share one), so a client scraping in a
loop costs the event loop one snapshot a second at most, and a scrape never shows state older
than its own arrival. Reading changes
nothing: only the groups already held are listed (the broker's tick loads the others).

What the endpoint reveals (docs/operations.md): topic names, partition counts and offsets, group
ids with committed offsets and lag, transaction and connection counts. `metrics.resource.labels.
enable=false` drops every topic, partition and group label (sums per broker instead). The
endpoint binds 127.0.0.1 by default; `metrics.web.config.file` adds TLS and basic
authentication in the Prometheus exporters' web-config format (`broker.metrics_web`)."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import sys
import threading
import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, ProcessCollector, make_wsgi_app
from prometheus_client import disable_created_metrics as _disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.api import kafka_api_name as api_name
from oncelog.protocol.errors import error_code

log = logging.getLogger(__name__)

# Produce and Fetch (the hot path), OffsetCommit and TxnOffsetCommit (an answer per partition, of
# thousands: reading one back cost more than writing it) count their partitions' errors as they
# build their answers; every other response's errors are counted from its bytes
_ERRORS_COUNTED_BY_HANDLER = frozenset({ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.OFFSET_COMMIT,
                                        ApiKey.TXN_OFFSET_COMMIT})

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


# prometheus_client adds a `_created` series beside every counter and histogram (the time it was
# made): 123 series that no dashboard uses. Process-wide, as the library offers it.
_disable_created_metrics()

SNAPSHOT_MIN_INTERVAL_S = 1.0   # snapshots are taken at most this often
SNAPSHOT_TIMEOUT_S = 10.0    # a loop that does not answer by then: the scrape has no state families


class BrokerMetrics:
    def __init__(self, partitions, resource_labels: bool = True) -> None:
        """`partitions()` returns the broker's Partition objects (read on the event loop);
        `resource_labels`: topic, partition and group labels (False: sums without them)."""
        self.resource_labels = resource_labels
        self._partitions = partitions
        self._broker: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._snapshot: tuple[float, list] | None = None
        self._snapshot_lock = threading.Lock()
        self.registry = CollectorRegistry()
        self.errors = Counter("oncelog_request_errors", "error codes answered, per partition or "
                              "resource", ["api", "error"], registry=self.registry)
        self.connections_closed = Counter("oncelog_connections_closed_on_bad_input",
                                          "connections closed for an oversized or malformed frame",
                                          registry=self.registry)
        self.handler_bugs = Counter("oncelog_handler_bugs", "requests whose handler raised (a bug in "
                                    "oncelog, logged with its traceback), answered UNKNOWN_SERVER_ERROR",
                                    registry=self.registry)
        # Per API (requests, bytes, latency) and per topic (Kafka's BrokerTopicMetrics: BytesInPerSec,
        # MessagesInPerSec, BytesOutPerSec; Redpanda's records produced / fetched): plain numbers
        # the event loop adds to, rendered by `_TrafficCollector` at a scrape. prometheus_client's
        # labelled children took 8 microseconds of every Produce (a lock and two checks per
        # increment, six increments): issue 38. Without resource labels the topics are summed.
        self._apis: dict[int, _ApiTraffic] = {}
        # topic ("" when summed) -> [bytes in, records in, bytes out, records out]
        self._topics: dict[str, list[int]] = {}
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ... (Linux)
        ProcessCollector(registry=self.registry)
        self.registry.register(_SnapshotCollector(self))
        self.registry.register(_TrafficCollector(self))
        self._server: WSGIServer | None = None

    def request_handled(self, api_key: int, version: int, request_bytes: int, body: bytes | list | None,
                        response_bytes: int, refused: int, bug: bool, seconds: float) -> None:
        """What the dispatch tells of each request it answered (or left unanswered: `body` None):
        the error code it answered the whole request with (`refused`, 0 if none), and whether a
        handler bug made it (`bug`). The request's errors are counted here, so the dispatch's
        error boundary makes this one call."""
        if bug:
            self.handler_bugs.inc()
        if body is not None:
            if api_key not in _ERRORS_COUNTED_BY_HANDLER and isinstance(body, bytes):
                self.count_response_errors(api_key, version, body)
            elif refused:
                self.count_errors(api_name(api_key), (refused,))
        self.observe(api_key, request_bytes, response_bytes, seconds)

    def observe(self, api_key: int, request_bytes: int, response_bytes: int, seconds: float) -> None:
        traffic = self._apis.get(api_key)
        if traffic is None:
            traffic = self._apis[api_key] = _ApiTraffic()
        traffic.request_bytes += request_bytes
        traffic.response_bytes += response_bytes
        traffic.seconds += seconds
        traffic.buckets[bisect_left(_LATENCY_BUCKETS, seconds)] += 1

    def _topic(self, topic: str) -> list[int]:
        key = topic if self.resource_labels else ""
        counts = self._topics.get(key)
        if counts is None:
            counts = self._topics[key] = [0, 0, 0, 0]
        return counts

    def produced(self, topic: str, size: int, records: int) -> None:
        counts = self._topic(topic)
        counts[0] += size
        counts[1] += records

    def fetched(self, topic: str, size: int, records: int) -> None:
        counts = self._topic(topic)
        counts[2] += size
        counts[3] += records

    def traffic_families(self) -> list:
        """The per-API and per-topic counters, read on the endpoint's thread: each number is read
        whole (the loop only adds), a histogram's buckets copied at once."""
        requests = CounterMetricFamily("oncelog_requests", "requests handled", labels=["api"])
        request_bytes = CounterMetricFamily("oncelog_request_bytes", "request bytes received", labels=["api"])
        response_bytes = CounterMetricFamily("oncelog_response_bytes", "response bytes sent", labels=["api"])
        latency = HistogramMetricFamily("oncelog_request_latency_seconds", "time from a request's arrival to "
                                        "its response", labels=["api"])
        for api_key, traffic in sorted(self._apis.copy().items()):
            api = [api_name(api_key)]
            buckets, total = list(traffic.buckets), traffic.seconds
            requests.add_metric(api, sum(buckets))   # the histogram's count: one per request
            request_bytes.add_metric(api, traffic.request_bytes)
            response_bytes.add_metric(api, traffic.response_bytes)
            cumulative, running = [], 0
            for bound, n in zip((*map(floatToGoString, _LATENCY_BUCKETS), "+Inf"), buckets):
                running += n
                cumulative.append((bound, running))
            latency.add_metric(api, cumulative, total)
        labels = ["topic"] if self.resource_labels else []
        topic_families = [CounterMetricFamily(name, doc, labels=labels) for name, doc in (
            ("oncelog_topic_bytes_in", "record bytes appended by producers"),
            ("oncelog_topic_messages_in", "records appended by producers"),
            ("oncelog_topic_bytes_out", "record bytes answered to Fetch requests"),
            ("oncelog_topic_messages_out", "records answered to Fetch requests (whole batches, as sent)"))]
        for topic, counts in sorted(self._topics.copy().items()):
            for family, value in zip(topic_families, list(counts)):
                family.add_metric([topic] if self.resource_labels else [], value)
        return [requests, request_bytes, response_bytes, latency, *topic_families]

    def count_errors(self, api: str, codes: Iterable[int]) -> None:
        for code in codes:
            if code:
                self.errors.labels(api, error_code(code).name).inc()

    def count_response_errors(self, api_key: int, version: int, body: bytes) -> None:
        """Every non-zero error code of a response, read back from its bytes."""
        try:
            response = entities.decode_response(api_key, version, body)
            self.count_errors(api_name(api_key), _error_codes(response))
        except Exception as e:  # noqa: BLE001 - counting must never cost a client its answer
            log.debug("errors of a %s v%d response not counted: %r", api_name(api_key), version, e)

    def watch(self, broker) -> None:
        """Gauges read from the broker in each snapshot: connections per listener, groups per
        type and state, consumer groups' committed offsets and lag, transactions per state."""
        self._broker = broker

    def families(self) -> list:
        """The state families of a snapshot taken on the event loop after this scrape arrived
        (scrapes at once share one; one a SNAPSHOT_MIN_INTERVAL_S at most, a scrape that comes
        sooner waits). Called on the loop itself (a test rendering the registry there), the
        snapshot is taken at once."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        loop = self._loop
        if loop is None or running is loop:
            return self._take()
        asked = time.monotonic()
        with self._snapshot_lock:
            if self._snapshot is not None:
                started, families = self._snapshot
                if started >= asked:
                    return families      # taken after this scrape arrived: shared with it
                # at most one snapshot a second: a scrape that comes sooner waits on its own thread
                time.sleep(max(0.0, started + SNAPSHOT_MIN_INTERVAL_S - time.monotonic()))
            started = time.monotonic()
            future = asyncio.run_coroutine_threadsafe(self._take_on_loop(), loop)
            try:
                families = future.result(SNAPSHOT_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - a stopping or stalled loop: counters are still served
                future.cancel()
                log.info("metrics: no snapshot of the broker's state this scrape: %r", e)
                return []
            self._snapshot = (started, families)
            return families

    async def _take_on_loop(self) -> list:
        return self._take()

    def _take(self) -> list:
        families = list(_partition_families(list(self._partitions()), self.resource_labels))
        if self._broker is not None:
            families += _broker_state_families(self._broker, self.resource_labels)
        return families

    def serve(self, host: str, port: int, idle_ms: int = -1, web_config: Any = None) -> int:
        """Start the /metrics HTTP endpoint (a thread per connection, as prometheus_client's own)
        from the event loop its snapshots are taken on; a connection that sends no request
        within `idle_ms` (connections.max.idle.ms; negative: never) is closed. `web_config`
        (`metrics_web.WebConfig`): TLS and basic authentication. Returns its port."""
        self._loop = asyncio.get_running_loop()
        handler = type("_Handler", (_QuietHandler,), {"timeout": idle_ms / 1000 if idle_ms >= 0 else None})
        server_class = type("_Server", (_MetricsServer,), {
            "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
        app = make_wsgi_app(self.registry)
        if web_config is not None:
            app = web_config.wrap(app)
            server_class = web_config.server_class(server_class)
        server: WSGIServer = make_server(host, port, app, server_class, handler_class=handler)
        threading.Thread(target=server.serve_forever, name="oncelog-metrics", daemon=True).start()
        self._server = server
        return server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _error_codes(entity: Any) -> Iterator[int]:
    for name, is_code in _error_fields(type(entity)):
        value = getattr(entity, name)
        if is_code:
            yield int(value)
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    yield from _error_codes(item)
        elif dataclasses.is_dataclass(value):
            yield from _error_codes(value)


_ERROR_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}


def _error_fields(cls: type) -> tuple[tuple[str, bool], ...]:
    """(field, is an error code) for the fields of a kio entity that are or may hold error codes."""
    fields = _ERROR_FIELDS.get(cls)
    if fields is None:
        fields = _ERROR_FIELDS[cls] = tuple(
            (f.name, f.metadata.get("kafka_type") == "error_code") for f in dataclasses.fields(cls)
            if f.metadata.get("kafka_type") == "error_code" or not f.metadata.get("kafka_type"))
    return fields


@dataclasses.dataclass(slots=True)
class _ApiTraffic:
    request_bytes: int = 0
    response_bytes: int = 0
    seconds: float = 0.0
    buckets: list[int] = dataclasses.field(default_factory=lambda: [0] * (len(_LATENCY_BUCKETS) + 1))


class _TrafficCollector:
    """`BrokerMetrics.traffic_families`."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def collect(self):
        yield from self._metrics.traffic_families()


class _SnapshotCollector:
    """The state families of `BrokerMetrics.families` (the endpoint's thread renders them)."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def collect(self):
        yield from self._metrics.families()


def _held_groups(b) -> list[tuple[str, str, str, str]]:
    """(group id, protocol type, state, group type) of the groups the coordinators hold now, read
    without loading or unloading any (ListGroups' `listing` reconciles first; a scrape must not)."""
    groups = b.groups
    return sorted([(gid, g.protocol_type or "", g.state, "classic") for gid, g in groups.classic.groups.items()]
                  + [(gid, "consumer", g.state, "consumer") for gid, g in groups.consumer.groups.items()]
                  + [(gid, "share", g.state, "share") for gid, g in groups.share.groups.items()])


def _broker_state_families(b, resource_labels: bool) -> list:
    """Connections, groups, committed offsets and lag, transactions: read on the event loop."""
    out = []
    connections = GaugeMetricFamily("oncelog_connections", "open client connections per listener",
                                    labels=["listener"])
    for listener, n in sorted(b.open_connections().items()):
        connections.add_metric([listener], n)
    out.append(connections)
    labels = ["group", "topic", "partition"] if resource_labels else []
    committed = GaugeMetricFamily("oncelog_consumer_group_committed_offset", "a group's committed offset per "
                                  "partition", labels=["group", "topic", "partition"])
    lag = GaugeMetricFamily("oncelog_consumer_group_lag", "log end offset (high watermark) minus the committed "
                            "offset, for partitions this broker leads"
                            + ("" if resource_labels else ", summed over every group and partition"), labels=labels)
    groups = GaugeMetricFamily("oncelog_groups", "groups this broker coordinates, per type (classic, "
                               "consumer or share) and state", labels=["type", "state"])
    try:
        listing = _held_groups(b)  # BrokerNotStarted (a RuntimeError) before the broker starts
        for (gtype, state), n in sorted(Tally((t, st) for _g, _p, st, t in listing).items()):
            groups.add_metric([gtype, state], n)
        total_lag = 0
        for group, topic, index, offset, end in _group_offsets(b, listing):
            if resource_labels:
                committed.add_metric([group, topic, str(index)], offset)
            if end is not None:
                if resource_labels:
                    lag.add_metric([group, topic, str(index)], max(0, end - offset))
                total_lag += max(0, end - offset)
        if not resource_labels:
            lag.add_metric([], total_lag)
    except RuntimeError as e:
        log.debug("consumer group metrics skipped this scrape: %s", e)
    out += [groups, committed, lag] if resource_labels else [groups, lag]
    states = GaugeMetricFamily("oncelog_transactions", "transactional ids this broker coordinates, per state",
                               labels=["state"])
    # KIP-939: a prepared two-phase-commit transaction nobody completes never times out and
    # holds its partitions' last stable offset: operators alert on this age (two_phase: "true")
    oldest = GaugeMetricFamily("oncelog_transaction_oldest_open_age_seconds", "age of the oldest open "
                               "(Ongoing) transaction this broker coordinates, 0 when none; two_phase=true for "
                               "two-phase commit ones (KIP-939), which no timeout aborts", labels=["two_phase"])
    try:
        tally, ages = _transaction_states(b)
        for state, n in sorted(tally.items()):
            states.add_metric([state], n)
        for kind in ("false", "true"):
            oldest.add_metric([kind], ages.get(kind, 0.0))
    except RuntimeError as e:
        log.debug("transaction metrics skipped this scrape: %s", e)
    out += [states, oldest]
    out += _share_families(b, resource_labels)
    out += _disk_families(b)
    return out


def _share_families(b, resource_labels: bool) -> list:
    """Share groups (KIP-932): what their share-partitions did (records acquired, redelivered,
    accepted, released, rejected, archived by the delivery limit, locks that ran out) and their
    lag: the high watermark minus the share-partition start offset (records not yet done with);
    and the fsyncs of their state logs (each covers every share-partition and request of a group
    that changed while the one before ran: fewer than ShareFetch requests under load). Dead-letter
    topics (KIP-1191): the events `dead_lettered` (records written to their group's dead-letter
    topic, Kafka's DeadLetterQueueRecordCount) and `dead_letter_failed` (archived without one: the
    topic refused them), and the dead letters still to write."""
    records = CounterMetricFamily("oncelog_share_records", "share-group records by event, over every "
                                  "share-partition this broker holds", labels=["event"])
    fsyncs = CounterMetricFamily("oncelog_share_state_fsyncs", "fsyncs of share groups' state logs "
                                 "(group commits of their share-partitions' state)")
    labels = ["group", "topic", "partition"] if resource_labels else []
    lag = GaugeMetricFamily("oncelog_share_group_lag", "high watermark minus the share-partition start offset"
                            + ("" if resource_labels else ", summed over every share-partition"), labels=labels)
    pending = GaugeMetricFamily("oncelog_share_dead_letters_pending", "records rejected or archived at the "
                                "delivery limit whose dead-letter record is not written yet (KIP-1191)")
    try:
        share = b.groups.share
        for event, n in vars(share.counts()).items():
            records.add_metric([event], n)
        fsyncs.add_metric([], share.commit.fsyncs)
        total = 0
        for (group, topic_id, index), sp in sorted(share.partitions.items(), key=lambda kv: str(kv[0])):
            name = b.logs.topic_name(topic_id)
            partition = b.logs.get_partition(name, index) if name is not None else None
            if partition is None:
                continue
            behind = max(0, partition.high_watermark - sp.start)
            total += behind
            if resource_labels:
                lag.add_metric([group, name, str(index)], behind)
        if not resource_labels:
            lag.add_metric([], total)
        pending.add_metric([], sum(len(sp.dead_letters()) for sp in share.partitions.values()))
    except RuntimeError as e:
        log.debug("share group metrics skipped this scrape: %s", e)
    return [records, lag, fsyncs, pending]


def _disk_families(b) -> list:
    """Free and total bytes of each data directory's filesystem (Redpanda's
    storage_disk_free_bytes / total_bytes): what an operator watches before the disk fills."""
    free = GaugeMetricFamily("oncelog_storage_disk_free_bytes", "bytes free on the filesystem of each "
                             "log.dirs directory (Produce is refused below storage.min.free.bytes)",
                             labels=["directory"])
    total = GaugeMetricFamily("oncelog_storage_disk_total_bytes", "size of the filesystem of each log.dirs "
                              "directory", labels=["directory"])
    reserve = GaugeMetricFamily("oncelog_storage_min_free_bytes", "storage.min.free.bytes: the reserve "
                                "Produce may not use")
    space = getattr(b, "disk_space", None)
    if space is None:
        return []
    for directory, usage in sorted(space.all_usage().items()):
        if usage.free >= 0:
            free.add_metric([str(directory)], usage.free)
            total.add_metric([str(directory)], usage.total)
    reserve.add_metric([], space.min_free_bytes)
    return [free, total, reserve]


def _group_offsets(b, listing) -> Iterator[tuple[str, str, int, int, int | None]]:
    """(group, topic, partition, committed offset, log end offset or None) for the groups this
    broker coordinates."""
    for group, _protocol_type, _state, _type in listing:
        if not b.coordinates(group):
            continue
        for (topic, index), c in sorted(dict(b.groups.committed(group)).items()):
            partition = b.logs.get_partition(topic, index)
            yield group, topic, index, c.offset, partition.high_watermark if partition is not None else None


def _transaction_states(b) -> tuple[dict[str, int], dict[str, float]]:
    """(ids per state, {"true"/"false": age in seconds of the oldest Ongoing transaction, 2PC or not})."""
    now = b.now_ms()
    code, _unknown, metas = b.txn.core.list_transactions(now)
    if code != 0:
        return {}, {}
    ages: dict[str, float] = {}
    for m in metas:
        if m.state.display_name == "Ongoing" and m.start_ms >= 0:
            kind = "true" if m.two_phase else "false"
            ages[kind] = max(ages.get(kind, 0.0), max(0, now - m.start_ms) / 1000)
    return dict(Tally(m.state.display_name for m in metas)), ages


def _partition_families(parts: list, resource_labels: bool):
    count = GaugeMetricFamily("oncelog_partitions", "partitions this broker leads")
    count.add_metric([], len(parts))
    yield count
    labels = ["topic", "partition"] if resource_labels else []
    size = GaugeMetricFamily("oncelog_log_size_bytes", "bytes on disk per partition"
                             + ("" if resource_labels else ", summed"), labels=labels)
    start = GaugeMetricFamily("oncelog_log_start_offset", "log start offset per partition", labels=labels)
    end = GaugeMetricFamily("oncelog_log_end_offset", "log end offset per partition", labels=labels)
    if resource_labels:
        for p in parts:
            labels = [p.topic, str(p.index)]
            size.add_metric(labels, p.log.size_bytes)
            start.add_metric(labels, p.log_start_offset)
            end.add_metric(labels, p.log_end_offset)
        yield from (size, start, end)
    else:   # offsets of different partitions do not add up: only the bytes are summed
        size.add_metric([], sum(p.log.size_bytes for p in parts))
        yield size
    values = producer_state_metrics(parts)
    for name, kind, doc, source in PRODUCER_STATE_METRICS:
        labels = (["topic"] if resource_labels else []) + (["kind"] if isinstance(source, dict) else [])
        family = (GaugeMetricFamily(name, doc, labels=labels) if kind == "gauge"
                  else CounterMetricFamily(name.removesuffix("_total"), doc, labels=labels))
        sums: dict[tuple[str, ...], float] = {}
        for label_values, value in values[name]:
            key = tuple(label_values[k] for k in labels)
            sums[key] = sums.get(key, 0) + value
        for key, value in sums.items():
            family.add_metric(list(key), value)
        yield family


# Producer state per topic: (name, type, help, the key of Partition.producer_state_stats that is
# summed, or {value of the "kind" label: key}).
PRODUCER_STATE_METRICS = (
    ("oncelog_producer_state_producers", "gauge", "producers tracked by partition producer state", "producers"),
    ("oncelog_producer_state_bytes", "gauge", "bytes held by producer state arrays", "bytes"),
    ("oncelog_producer_state_duplicates_total", "counter",
     "duplicate batches answered, by kind: latest/window/tail (with the original offset) or "
     "sequence (DUPLICATE_SEQUENCE_NUMBER)",
     {"latest": "duplicates_latest", "window": "duplicates_window", "tail": "duplicates_tail",
      "sequence": "duplicates_sequence"}),
    ("oncelog_producer_state_out_of_order_total", "counter", "OUT_OF_ORDER_SEQUENCE_NUMBER answers",
     "out_of_order"),
    ("oncelog_producer_state_unknown_producer_total", "counter", "UNKNOWN_PRODUCER_ID answers",
     "unknown_producer"),
    ("oncelog_producer_state_invalid_epoch_total", "counter", "INVALID_PRODUCER_EPOCH answers", "invalid_epoch"),
    ("oncelog_producer_state_unsupported_format_total", "counter",
     "idempotent produce refused on topics below message format v2", "unsupported_format"),
    ("oncelog_producer_state_expirations_total", "counter", "producers removed by producer.id.expiration.ms",
     "expirations"),
    ("oncelog_producer_state_restored_total", "counter",
     "expired producers restored from the log when they came back", "restored"),
    ("oncelog_producer_state_producers_evicted_total", "counter",
     "least recently updated producers moved to the remembered set at "
     "producer.state.max.producers.per.partition", "producers_evicted"),
    ("oncelog_producer_state_remembered_forgotten_total", "counter",
     "remembered producers forgotten at producer.state.max.remembered.producers.per.partition "
     "(their next batch meets UNKNOWN_PRODUCER_ID above the producer-state start offset)",
     "remembered_forgotten"),
    ("oncelog_producer_state_expired_remembered", "gauge",
     "expired or evicted producers remembered with the log position of their batches", "expired_remembered"),
)


def producer_state_metrics(partitions) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Per-topic sums over `partitions`: {metric name: [(labels, value), ...]}, labels always
    holding `topic` (and `kind` for duplicates)."""
    per_topic: dict[str, dict[str, int]] = {}
    for p in partitions:
        sums = per_topic.setdefault(p.topic, {})
        for key, value in p.producer_state_stats().items():
            sums[key] = sums.get(key, 0) + value
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, _kind, _doc, source in PRODUCER_STATE_METRICS:
        rows = out[name] = []
        for topic, stats in sorted(per_topic.items()):
            if isinstance(source, dict):
                rows.extend(({"topic": topic, "kind": kind}, stats[key]) for kind, key in source.items())
            else:
                rows.append(({"topic": topic}, stats[source]))
    return out


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 - the name WSGIRequestHandler gives it
        """Scrapes are not logged."""


class _MetricsServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """One log line, not a traceback on stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, TimeoutError):
            log.info("metrics: closed the connection from %s:%s: no request within connections.max.idle.ms",
                     *client_address[:2])
        else:
            log.warning("metrics: a request from %s:%s failed: %r", *client_address[:2], error)
