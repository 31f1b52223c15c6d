"""Topic-level configuration: Kafka's names, types, defaults and validation, in one table.

Storage builds a partition's `LogConfig` and producer-state settings from these values; the broker
serves them through DescribeConfigs, validates CreateTopics / IncrementalAlterConfigs with them (the
controller too, in cluster mode) and takes server-wide defaults from their `log.`-prefixed twins
(Kafka's `LogConfig` synonyms).

Every bound here is the bound the consumer of the value accepts (producer-state limits come from
`core.producer_state`, an "int" is a Kafka INT32, a "long" an INT64), so a value that passes
validation can always be applied. Values read back from storage go through
`effective_topic_config`, which never raises: an override that no longer validates (written by an
older version, or edited by hand) is reported and the default used, so it cannot stop a start.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from oncelog.core import producer_state as ps
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol.records import parse_message_format_version

INT_MIN, INT_MAX = -2**31, 2**31 - 1
LONG_MIN, LONG_MAX = -2**63, 2**63 - 1
WEEK_MS = 7 * 24 * 3600 * 1000
# Kafka's BrokerCompressionType names; "producer" keeps the batch's own codec
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")


class ConfigError(ValueError):
    """A setting that does not parse or validate, or contradicts another one: the one config
    error of broker and client (Kafka's ConfigException). The broker answers INVALID_CONFIG for
    a topic's; the client raises it from a producer's constructor."""


def _int(text: Any) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise ConfigError(f"{text!r} is not an integer") from None


def _bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    t = str(text).strip().lower()
    if t in ("true", "false"):
        return t == "true"
    raise ConfigError(f"{text!r} is not true or false")


@dataclass(frozen=True)
class ConfigDef:
    name: str
    kind: str  # "int" | "long" | "string" | "boolean" | "list" | "double"
    default: Any
    doc: str
    server_name: str | None = None  # the broker-wide default's name
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], None] | None = None

    def parse(self, raw: Any) -> Any:
        if raw is None:
            return self.default
        if self.kind in ("int", "long"):
            value = _int(raw)
            low, high = (INT_MIN, INT_MAX) if self.kind == "int" else (LONG_MIN, LONG_MAX)
            low = low if self.minimum is None else max(low, self.minimum)
            high = high if self.maximum is None else min(high, self.maximum)
            if value < low:
                raise ConfigError(f"{self.name}={value} is below the minimum {low}")
            if value > high:
                raise ConfigError(f"{self.name}={value} is above the maximum {high}")
            return value
        if self.kind == "boolean":
            return _bool(raw)
        if self.kind == "double":
            try:
                number = float(raw)
            except ValueError:
                raise ConfigError(f"{raw!r} is not a number") from None
            if self.check is not None:
                self.check(number)
            return number
        text = str(raw).strip()
        if self.choices is not None:
            # Kafka's validators: lower-case choices take any case (Kafka lower-cases the value
            # first); mixed-case ones (CreateTime, LogAppendTime) must match exactly.
            choice = text if any(not c.islower() for c in self.choices) else text.lower()
            if choice not in self.choices:
                raise ConfigError(f"{self.name}={text!r} is not one of {', '.join(self.choices)}")
            text = choice
        if self.check is not None:
            self.check(text)
        if self.kind == "list":  # Kafka's list values: comma-separated, no blanks
            text = ",".join(v.strip() for v in text.split(",") if v.strip())
        return text

    def render(self, value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


def _message_format(value: str) -> None:
    try:
        parse_message_format_version(value)
    except ValueError as e:
        raise ConfigError(str(e)) from None


CLEANUP_POLICIES = ("compact", "delete")


@functools.lru_cache(maxsize=64)
def cleanup_policies(value: str) -> frozenset[str]:
    """The policies of a `cleanup.policy` value ("compact,delete" -> {"compact", "delete"});
    cached: storage asks it of every append (`LogConfig.compact`)."""
    return frozenset(p.strip().lower() for p in str(value).split(",") if p.strip())


def _cleanup_policy(value: str) -> None:
    parts = [p.strip().lower() for p in value.split(",") if p.strip()]
    if not parts:
        raise ConfigError("cleanup.policy needs compact, delete or both")
    bad = [p for p in parts if p not in CLEANUP_POLICIES]
    if bad:
        raise ConfigError(f"cleanup.policy={value!r}: {', '.join(bad)} is not one of compact, delete")


def _ratio(value: Any) -> None:
    if not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"min.cleanable.dirty.ratio={value} is not between 0 and 1")


def alter_list(current: str, values: str, append: bool) -> str:
    """IncrementalAlterConfigs APPEND / SUBTRACT on a list config (Kafka's ConfigAdminManager):
    APPEND adds the values not already there, after the current ones; SUBTRACT removes them."""
    have = [v.strip() for v in str(current).split(",") if v.strip()]
    given = [v.strip() for v in str(values).split(",") if v.strip()]
    if append:
        return ",".join(have + [v for v in dict.fromkeys(given) if v not in have])
    return ",".join(v for v in have if v not in given)


TOPIC_CONFIGS: dict[str, ConfigDef] = {c.name: c for c in (
    ConfigDef("cleanup.policy", "list", "delete", "delete: whole old segments go by retention.ms / "
              "retention.bytes; compact: the cleaner keeps the latest record of each key (records "
              "without a key are refused); compact,delete: both.", "log.cleanup.policy",
              check=_cleanup_policy),
    ConfigDef("delete.retention.ms", "long", 86400000, "Compacted topics: how long a tombstone (and "
              "a transaction marker whose records are gone) stays after the cleaner first met it.",
              "log.cleaner.delete.retention.ms", minimum=0),
    ConfigDef("min.cleanable.dirty.ratio", "double", 0.5, "Compacted topics: the share of the log "
              "not yet cleaned above which the cleaner runs.", "log.cleaner.min.cleanable.ratio",
              check=_ratio),
    ConfigDef("min.compaction.lag.ms", "long", 0, "Compacted topics: a record stays uncompacted at "
              "least this long.", "log.cleaner.min.compaction.lag.ms", minimum=0),
    ConfigDef("max.compaction.lag.ms", "long", LONG_MAX, "Compacted topics: a record is cleaned "
              "within about this long, whatever the dirty ratio.", "log.cleaner.max.compaction.lag.ms",
              minimum=1),
    ConfigDef("file.delete.delay.ms", "long", 60000, "Accepted for compatibility: oncelog deletes a "
              "segment's files at once (reads copy whole batches on the thread that deletes).",
              "log.segment.delete.delay.ms", minimum=0),
    ConfigDef("segment.bytes", "int", 1 << 30, "Segment file size before a roll.",
              "log.segment.bytes", minimum=14),
    ConfigDef("segment.ms", "long", WEEK_MS, "Segment age before a roll.", "log.roll.ms", minimum=1),
    ConfigDef("retention.ms", "long", WEEK_MS, "Age after which whole segments are deleted (-1: never).",
              "log.retention.ms", minimum=-1),
    ConfigDef("retention.bytes", "long", -1, "Partition size above which old segments are deleted "
              "(-1: no limit).", "log.retention.bytes", minimum=-1),
    ConfigDef("flush.messages", "long", LONG_MAX, "fsync after this many messages "
              "(default: leave it to the OS, as Kafka does).", "log.flush.interval.messages", minimum=1),
    ConfigDef("flush.ms", "long", LONG_MAX, "fsync when the oldest unflushed data is this old.",
              "log.flush.interval.ms", minimum=0),
    ConfigDef("write.caching", "boolean", False, "false: an acks=all Produce is answered once its "
              "batch is fsynced (group commit) and consumers see only fsynced records; true: "
              "answered from the page cache, as Kafka does without flush.messages (Redpanda's name).",
              "write.caching.default"),
    ConfigDef("index.interval.bytes", "int", 4096, "Bytes between offset-index entries.",
              "log.index.interval.bytes", minimum=0),
    ConfigDef("max.message.bytes", "int", 1048588, "Largest record batch accepted.",
              "message.max.bytes", minimum=0),
    ConfigDef("message.timestamp.type", "string", "CreateTime", "CreateTime or LogAppendTime.",
              "log.message.timestamp.type", choices=("CreateTime", "LogAppendTime")),
    ConfigDef("compression.type", "string", "producer", "The codec of the topic's batches: producer "
              "keeps what the producer chose; any other value makes the broker recompress a batch "
              "that arrives under another codec (uncompressed, gzip, snappy, lz4, zstd).",
              "compression.type", choices=COMPRESSION_TYPES),
    ConfigDef("message.format.version", "string", "3.0", "Record format: below 0.11 (v0/v1 message "
              "sets) refuses idempotent produce.", "log.message.format.version", check=_message_format),
    ConfigDef("producer.state.dedup.mode", "string", "window", "window (KIP-1269) or range (KIP-758).",
              "log.producer.state.dedup.mode", choices=("window", "range")),
    ConfigDef("producer.state.batches.to.retain", "int", ps.MIN_BATCHES_TO_RETAIN, "Batches retained "
              "per producer in window mode (KIP-1269).", "log.producer.state.batches.to.retain",
              minimum=ps.MIN_BATCHES_TO_RETAIN, maximum=ps.MAX_BATCHES_TO_RETAIN),
    ConfigDef("max.in.flight.sequence.number.per.connection", "int", ps.DEFAULT_MAX_IN_FLIGHT_SEQUENCES,
              "Range mode: how far below the latest sequence a duplicate may lie (KIP-758).",
              "max.in.flight.sequence.number.per.connection", minimum=1, maximum=ps.MAX_IN_FLIGHT_SEQUENCES),
    ConfigDef("producer.state.duplicate.lookup.offsets", "long", 0, "How many offsets of the log tail "
              "are scanned for a duplicate older than the window (0: off).",
              "producer.state.duplicate.lookup.offsets", minimum=0, maximum=ps.MAX_LOOKUP_OFFSETS),
    ConfigDef("producer.state.expired.lookup.offsets", "long", ps.DEFAULT_EXPIRED_LOOKUP_OFFSETS,
              "When an expired or evicted producer whose batches are still in the log comes back, "
              "the header of each batch it retained is read through the offset index; those more "
              "than this many offsets below its newest batch are left out (0: the newest batch only).",
              "producer.state.expired.lookup.offsets", minimum=0, maximum=ps.MAX_LOOKUP_OFFSETS),
    ConfigDef("producer.state.max.producers.per.partition", "int", ps.DEFAULT_MAX_PRODUCERS,
              "Producers whose state a partition tracks. A new producer beyond it evicts the least "
              "recently updated one (of a bounded scan) into the remembered set, from which its "
              "next batch restores it from the log with its deduplication intact. Kafka has no "
              "such limit.",
              "log.producer.state.max.producers.per.partition", minimum=1, maximum=ps.MAX_MAX_PRODUCERS),
    ConfigDef("producer.state.max.remembered.producers.per.partition", "int", ps.DEFAULT_MAX_REMEMBERED,
              "Expired or evicted producers a partition remembers (the offsets of the batches they "
              "retained: 8 B per batch plus about 25 B). Beyond it those whose newest batch is "
              "oldest are forgotten; their next batch gets UNKNOWN_PRODUCER_ID with a log start "
              "offset above everything they wrote (a reset for their client, not data loss).",
              "log.producer.state.max.remembered.producers.per.partition", minimum=0,
              maximum=ps.MAX_MAX_PRODUCERS),
    # KIP-1191 (Kafka's TopicConfig.ERRORS_DEADLETTERQUEUE_GROUP_ENABLE_CONFIG): the topic's
    # administrator lets share groups use it as their dead-letter topic
    ConfigDef("errors.deadletterqueue.group.enable", "boolean", False, "Whether share groups may use this "
              "topic as their dead-letter topic (errors.deadletterqueue.topic.name): the broker writes the "
              "records a group rejects, or archives at its delivery limit, only to a topic that allows it."),
)}

SERVER_NAME_TO_TOPIC = {c.server_name: c.name for c in TOPIC_CONFIGS.values() if c.server_name}


def parse_topic_configs(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Typed values for overrides given as strings; unknown names and bad values raise."""
    out = {}
    for name, value in raw.items():
        definition = TOPIC_CONFIGS.get(name)
        if definition is None:
            raise KafkaProtocolError(ErrorCode.INVALID_CONFIG, f"unknown topic config {name!r}")
        try:
            out[name] = definition.parse(value)
        except ConfigError as e:
            raise KafkaProtocolError(ErrorCode.INVALID_CONFIG, str(e)) from None
    return out


def invalid_topic_configs(overrides: Mapping[str, Any]) -> dict[str, str]:
    """{name: why} for stored overrides that do not validate (unknown names included)."""
    bad = {}
    for name, value in overrides.items():
        definition = TOPIC_CONFIGS.get(name)
        if definition is None:
            bad[name] = f"unknown topic config {name!r}"
            continue
        try:
            definition.parse(value)
        except ConfigError as e:
            bad[name] = str(e)
    return bad


def effective_topic_config(server_defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Every topic config, typed: the topic's override, else the server default, else Kafka's.

    Never raises for stored overrides: one that does not validate is skipped (the server default
    applies); callers that load stored configs report `invalid_topic_configs` once."""
    out = {name: d.default for name, d in TOPIC_CONFIGS.items()}
    out.update({k: v for k, v in server_defaults.items() if k in TOPIC_CONFIGS})
    bad = invalid_topic_configs(overrides)
    out.update(parse_topic_configs({k: v for k, v in overrides.items() if k not in bad}))
    return out
