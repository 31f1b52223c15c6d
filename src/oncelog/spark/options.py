"""Options of the `oncelog` format, with the names and meanings of Spark's Kafka source and sink.

Pure parsing: no Spark, no sockets, so it is usable (and testable) anywhere."""
from __future__ import annotations

import json
import re
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


def read_options(options, streaming: bool) -> ReadOptions:
    opts = {k.lower(): v for k, v in dict(options).items()}
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
