"""Options of the `oncelog` format, with the names and meanings of Spark's Kafka source and sink.

Pure parsing: no Spark, no sockets, so it is usable (and testable) anywhere."""
from __future__ import annotations

import difflib
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, overload

from oncelog.client import config_keys

EARLIEST = -2
LATEST = -1
MARKER_TOPIC = "__oncelog_spark_commits"


class OncelogSparkError(ValueError):
    """A misconfiguration, reported with what to do about it."""


def _bool(options, name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    v = str(raw).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise OncelogSparkError(f"option {name}={raw!r}: expected true or false")


@overload
def _int(options: Any, name: str, default: int, minimum: int = 1) -> int: ...
@overload
def _int(options: Any, name: str, default: None, minimum: int = 1) -> int | None: ...
def _int(options: Any, name: str, default: int | None, minimum: int = 1) -> int | None:
    raw = options.get(name.lower())
    if raw is None or str(raw).strip() == "":
        return default
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise OncelogSparkError(f"option {name}={raw!r}: expected an integer") from None
    if v < minimum:
        raise OncelogSparkError(f"option {name}={raw!r}: must be at least {minimum}")
    return v


def bootstrap_servers(options) -> str:
    servers = options.get("bootstrap.servers") or options.get("kafka.bootstrap.servers")
    if not servers:
        raise OncelogSparkError(
            "option bootstrap.servers is required, e.g. "
            ".option('bootstrap.servers', '127.0.0.1:9092') (kafka.bootstrap.servers also works)")
    return str(servers)


# Options of Spark's Kafka source and sink (docs/structured-streaming-kafka-integration.md), in
# lower case as Spark hands them to a Python data source, plus oncelog's own. Every one of them
# either acts or is refused by name: a Kafka job that moves over never loses a setting silently.
READ_OPTIONS = frozenset({
    "bootstrap.servers", "kafka.bootstrap.servers", "assign", "subscribe", "subscribepattern",
    "startingoffsets", "endingoffsets", "startingtimestamp", "startingoffsetsbytimestamp",
    "endingtimestamp", "endingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy",
    "failondataloss", "kafkaconsumer.polltimeoutms", "fetchoffset.numretries",
    "fetchoffset.retryintervalms", "maxoffsetspertrigger", "minoffsetspertrigger",
    "maxtriggerdelay", "minpartitions", "maxrecordsperpartition", "groupidprefix",
    "includeheaders"})
WRITE_OPTIONS = frozenset({
    "bootstrap.servers", "kafka.bootstrap.servers", "topic", "includeheaders",
    "deliveryguarantee", "twophasecommit", "sinkid", "committopic"})
# what Spark itself adds to a writer's options (streaming: the checkpoint), and `path`, which
# `.save(path)` / `.load(path)` would set
_SPARK_OWN = frozenset({"checkpointlocation", "path"})

# Kafka settings Spark's connector refuses, with its reasons (KafkaSourceProvider)
_FORBIDDEN_READ = {
    "auto.offset.reset": "set the option startingOffsets instead (earliest, latest or JSON)",
    "key.deserializer": "keys are always read as bytes; deserialize them with DataFrame operations",
    "value.deserializer": "values are always read as bytes; deserialize them with DataFrame "
                          "operations",
    "enable.auto.commit": "the source never commits offsets: the checkpoint records progress",
    "interceptor.classes": "the source runs no consumer interceptors",
}
_FORBIDDEN_WRITE = {
    "key.serializer": "keys are written as given (string or binary); serialize them with "
                      "DataFrame operations",
    "value.serializer": "values are written as given (string or binary); serialize them with "
                        "DataFrame operations",
    "interceptor.classes": "the sink runs no producer interceptors",
    "partitioner.class": "the sink partitions with Kafka's default partitioner (murmur2 of the "
                         "key); give the DataFrame a `partition` column to choose partitions",
}


def _check_names(opts: dict, known: frozenset, forbidden: dict, what: str) -> None:
    """Refuse an option the connector would otherwise ignore: a misspelt one (naming the nearest
    known option, as confluent-kafka does for its properties) or a Kafka setting it cannot honour.
    Names starting with `_` are test hooks; `kafka.<name>` settings go to oncelog's client, which
    checks them itself."""
    for name in opts:
        if name.startswith("kafka."):
            setting = name[len("kafka."):]
            if setting in forbidden:
                raise OncelogSparkError(f"option {name} is not supported by the oncelog {what}: "
                                        f"{forbidden[setting]}")
            continue
        if name in known or name in _SPARK_OWN or name.startswith("_"):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        raise OncelogSparkError(
            f"option {name} is not an option of the oncelog {what}"
            + (f" (did you mean {_SPELLING.get(near[0], near[0])}?)" if near else "")
            + "; see docs/spark.md for the options it takes")


# how the docs spell each option (Spark lower-cases them before a Python source sees them)
_SPELLING = {n.lower(): n for n in (
    "subscribePattern", "startingOffsets", "endingOffsets", "startingTimestamp",
    "startingOffsetsByTimestamp", "endingTimestamp", "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "failOnDataLoss", "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries", "fetchOffset.retryIntervalMs", "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions", "maxRecordsPerPartition",
    "groupIdPrefix", "includeHeaders", "deliveryGuarantee", "twoPhaseCommit", "sinkId",
    "commitTopic")}


def client_config(options) -> dict:
    """Client settings: bootstrap.servers plus any `kafka.`-prefixed option (as Spark passes them)."""
    cfg = {"bootstrap.servers": bootstrap_servers(options)}
    for k, v in dict(options).items():
        if k.startswith("kafka.") and k != "kafka.bootstrap.servers":
            name = k[len("kafka."):]
            if name not in config_keys.ANY:   # a typo would otherwise do nothing, silently
                raise OncelogSparkError(f"option {k}: {config_keys.unknown_message(name)}")
            cfg[name] = v
    return cfg


def parse_duration_ms(raw, option: str) -> int:
    """Spark's time strings (JavaUtils.timeStringAsMs): `15m`, `30s`, `500ms`, `1h`, `2d`; a bare
    number is milliseconds."""
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", str(raw).lower())
    if m is None:
        raise OncelogSparkError(f"option {option}={raw!r}: expected a duration such as 15m, 30s, "
                                "500ms or 1h")
    unit = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
            "d": 86_400_000}[m.group(2)]
    return int(m.group(1)) * unit


def parse_timestamps_json(raw: str, option: str) -> dict[str, dict[int, int]]:
    """Spark's `{"topicA":{"0":1700000000000,"1":...}}` (milliseconds since the epoch)."""
    hint = f'option {option} must be JSON like {{"topicA":{{"0":1700000000000}}}} (ms since the epoch)'
    try:
        obj = json.loads(raw)
    except (TypeError, ValueError) as e:
        raise OncelogSparkError(f"{hint}; got {raw!r} ({e})") from None
    if not isinstance(obj, dict) or not all(isinstance(ps, dict) for ps in obj.values()):
        raise OncelogSparkError(f"{hint}; got {raw!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in obj.items():
        for p, ts in parts.items():
            if not str(p).isdigit() or isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                raise OncelogSparkError(f"{hint}; {topic}-{p}: {ts!r}")
            out.setdefault(topic, {})[int(p)] = ts
    return out


def parse_offsets_json(raw: str, option: str) -> dict[str, dict[int, int]]:
    """Kafka's offset JSON `{"topic":{"0":23,"1":-2}}` -> {topic: {partition: offset}}."""
    hint = (f"option {option} must be earliest, latest or JSON like "
            '{"topicA":{"0":23,"1":-2}} (-2 = earliest, -1 = latest)')
    try:
        obj = json.loads(raw)
    except (TypeError, ValueError) as e:
        raise OncelogSparkError(f"{hint}; got {raw!r} ({e})") from None
    if not isinstance(obj, dict):
        raise OncelogSparkError(f"{hint}; got {raw!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in obj.items():
        if not isinstance(parts, dict):
            raise OncelogSparkError(f"{hint}; topic {topic!r} maps to {parts!r}, not an object")
        out[topic] = {}
        for p, off in parts.items():
            try:
                pi = int(p)
            except ValueError:
                raise OncelogSparkError(f"{hint}; partition {p!r} of {topic!r} is not a number") from None
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                raise OncelogSparkError(f"{hint}; offset {off!r} of {topic}-{p} is not an offset")
            out[topic][pi] = off
    return out


def canonical(offsets: dict[str, dict[int, int]]) -> dict[str, dict[str, int]]:
    """The offset dict Spark stores: topics and partitions in sorted order (Spark compares the
    JSON text, so key order must never vary), partition keys as strings."""
    return {t: {str(p): int(offsets[t][p]) for p in sorted(offsets[t], key=int)}
            for t in sorted(offsets)}


def from_spark(offsets: dict) -> dict[str, dict[int, int]]:
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in offsets.items()}


@dataclass
class ReadOptions:
    client: dict
    subscribe: list[str] | None = None
    pattern: str | None = None
    assign: dict[str, list[int]] | None = None
    starting: str | dict = "earliest"
    ending: str | dict = "latest"
    include_headers: bool = False
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    poll_timeout_ms: int = 120000
    # startingTimestamp (one time for every partition) or startingOffsetsByTimestamp
    # ({topic: {partition: ms}}): these win over startingOffsets, as in Spark; likewise ending
    starting_ts: int | dict | None = None
    ending_ts: int | dict | None = None
    # no offset at or after the starting time: "error" fails the query, "latest" starts at the end
    ts_strategy: str = "error"
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    fetch_retries: int = 3
    fetch_retry_interval_ms: int = 10
    extra: dict = field(default_factory=dict)


def _position(options, name: str, default: str, allow_latest: bool, allow_earliest: bool):
    raw = options.get(name.lower())
    if raw is None:
        return default
    v = str(raw).strip()
    if v.lower() == "earliest":
        if not allow_earliest:
            raise OncelogSparkError(f"option {name}=earliest is not allowed here")
        return "earliest"
    if v.lower() == "latest":
        if not allow_latest:
            raise OncelogSparkError(f"option {name}=latest is not allowed for batch queries "
                                    "(use it in readStream)")
        return "latest"
    parsed = parse_offsets_json(v, name)
    if not allow_earliest and any(o == EARLIEST for ps in parsed.values() for o in ps.values()):
        raise OncelogSparkError(f"option {name}: -2 (earliest) is not allowed as an ending offset")
    if not allow_latest and any(o == LATEST for ps in parsed.values() for o in ps.values()):
        raise OncelogSparkError(f"option {name}: -1 (latest) is not allowed as a starting offset "
                                "of a batch query")
    return parsed


def _timestamps(opts: dict, single: str, by_partition: str):
    """`single` (one time for all partitions) wins over `by_partition` (JSON), as in Spark."""
    if opts.get(single.lower()) not in (None, ""):
        return _int(opts, single, None, minimum=0)
    raw = opts.get(by_partition.lower())
    return None if raw in (None, "") else parse_timestamps_json(str(raw), by_partition)


def read_options(options, streaming: bool) -> ReadOptions:
    opts = {k.lower(): v for k, v in dict(options).items()}
    _check_names(opts, READ_OPTIONS, _FORBIDDEN_READ, "source")
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
    if len(chosen) != 1:
        raise OncelogSparkError(
            "set exactly one of the options subscribe (comma-separated topics), subscribePattern "
            "(a regex) or assign (JSON like {\"topicA\":[0,1]})"
            + (f"; got {', '.join(chosen)}" if chosen else ""))
    ro = ReadOptions(client=client_config(opts))
    if "isolation.level" in ro.client:
        # read_committed: end offsets are the last stable offset (ListOffsets and Fetch with
        # isolation level 1), aborted records are dropped, offsets have gaps
        isolation = str(ro.client["isolation.level"]).strip().lower()
        if isolation not in ("read_uncommitted", "read_committed"):
            raise OncelogSparkError(f"option kafka.isolation.level={isolation!r}: expected "
                                    "read_uncommitted (the default) or read_committed")
        ro.client["isolation.level"] = isolation
    if opts.get("subscribe"):
        ro.subscribe = [t.strip() for t in str(opts["subscribe"]).split(",") if t.strip()]
        if not ro.subscribe:
            raise OncelogSparkError("option subscribe names no topic")
    elif opts.get("subscribepattern"):
        try:
            re.compile(opts["subscribepattern"])
        except re.error as e:
            raise OncelogSparkError(f"option subscribePattern is not a valid regex: {e}") from None
        ro.pattern = str(opts["subscribepattern"])
    else:
        try:
            obj = json.loads(opts["assign"])
            if not isinstance(obj, dict) or not all(
                    isinstance(ps, list) and all(isinstance(p, int) and p >= 0 for p in ps)
                    for ps in obj.values()):
                raise ValueError("not {topic: [partitions]}")
        except ValueError as e:
            raise OncelogSparkError(
                f'option assign must be JSON like {{"topicA":[0,1]}}; got {opts["assign"]!r} ({e})'
            ) from None
        ro.assign = {t: sorted(set(ps)) for t, ps in obj.items()}
    ro.starting = _position(opts, "startingOffsets", "latest" if streaming else "earliest",
                            allow_latest=streaming, allow_earliest=True)
    if streaming and opts.get("endingoffsets"):
        raise OncelogSparkError("option endingOffsets is for batch reads only")
    ro.ending = _position(opts, "endingOffsets", "latest", allow_latest=True, allow_earliest=False)
    ro.include_headers = _bool(opts, "includeHeaders", False)
    ro.fail_on_data_loss = _bool(opts, "failOnDataLoss", True)
    ro.max_offsets_per_trigger = _int(opts, "maxOffsetsPerTrigger", None)
    ro.min_partitions = _int(opts, "minPartitions", None)
    ro.max_records_per_partition = _int(opts, "maxRecordsPerPartition", None)
    ro.poll_timeout_ms = _int(opts, "kafkaConsumer.pollTimeoutMs", 120000)
    ro.starting_ts = _timestamps(opts, "startingTimestamp", "startingOffsetsByTimestamp")
    ro.ending_ts = _timestamps(opts, "endingTimestamp", "endingOffsetsByTimestamp")
    if streaming:
        for name in ("endingTimestamp", "endingOffsetsByTimestamp"):
            if opts.get(name.lower()):
                raise OncelogSparkError(f"option {name} is for batch reads only")
    strategy = str(opts.get("startingoffsetsbytimestampstrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OncelogSparkError(
            f"option startingOffsetsByTimestampStrategy={opts['startingoffsetsbytimestampstrategy']!r}: "
            "expected error (the default) or latest")
    ro.ts_strategy = strategy
    ro.min_offsets_per_trigger = _int(opts, "minOffsetsPerTrigger", None)
    if opts.get("maxtriggerdelay") not in (None, ""):
        ro.max_trigger_delay_ms = parse_duration_ms(opts["maxtriggerdelay"], "maxTriggerDelay")
    if not streaming:
        for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
            if opts.get(name.lower()) not in (None, ""):
                raise OncelogSparkError(f"option {name} is for streaming reads only")
    ro.fetch_retries = _int(opts, "fetchOffset.numRetries", 3, minimum=0)
    ro.fetch_retry_interval_ms = _int(opts, "fetchOffset.retryIntervalMs", 10, minimum=0)
    # The source's consumers read assigned partitions and never join a group or commit (Spark's
    # do the same): the group id only names them, `kafka.group.id` as given, else
    # `<groupIdPrefix>-<uuid>` (Spark's default prefix spark-kafka-source)
    if "group.id" not in ro.client:
        prefix = str(opts.get("groupidprefix") or "spark-kafka-source")
        ro.client["group.id"] = f"{prefix}-{uuid.uuid4()}"
    ro.client["enable.auto.commit"] = "false"
    return ro


@dataclass
class WriteOptions:
    client: dict
    topic: str | None
    include_headers: bool
    sink_id: str | None
    marker_topic: str
    exactly_once: bool = True
    # KIP-939 two-phase commit for the task transactions: "auto" (where the broker enables
    # transaction.two.phase.commit.enable), "true" (required), "false"; the driver resolves it
    # to `two_phase` before the writer goes to the tasks
    two_phase_option: str = "auto"
    two_phase: bool = False


DELIVERY_GUARANTEES = ("exactly-once", "at-least-once")


def write_options(options) -> WriteOptions:
    opts = {k.lower(): v for k, v in dict(options).items()}
    _check_names(opts, WRITE_OPTIONS, _FORBIDDEN_WRITE, "sink")
    cfg = client_config(opts)
    # every task produces idempotently; a user cannot switch it off by accident
    cfg["enable.idempotence"] = "true"
    cfg.setdefault("acks", "all")
    cfg.setdefault("linger.ms", "5")
    guarantee = str(opts.get("deliveryguarantee") or "exactly-once").strip().lower()
    if guarantee not in DELIVERY_GUARANTEES:
        raise OncelogSparkError(f"option deliveryGuarantee={opts.get('deliveryguarantee')!r}: "
                                "expected exactly-once (the default) or at-least-once")
    two_phase = str(opts.get("twophasecommit") or "auto").strip().lower()
    if two_phase not in ("auto", "true", "false"):
        raise OncelogSparkError(f"option twoPhaseCommit={opts.get('twophasecommit')!r}: expected auto "
                                "(the default), true or false")
    if "transactional.id" in cfg:
        raise OncelogSparkError("option kafka.transactional.id: the sink names each task's "
                                "transaction itself (set sinkId to choose the prefix)")
    return WriteOptions(client=cfg, topic=opts.get("topic") or None,
                        include_headers=_bool(opts, "includeHeaders", False),
                        sink_id=opts.get("sinkid") or None,
                        marker_topic=opts.get("committopic") or MARKER_TOPIC,
                        exactly_once=guarantee == "exactly-once", two_phase_option=two_phase)
