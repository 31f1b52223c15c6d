"""The settings each client takes, so that a misspelt one is refused instead of silently doing
nothing, as confluent-kafka (librdkafka) refuses it: "No such configuration property".

As librdkafka, a setting of another client (a producer's `linger.ms` given to a consumer) is
known, not a typo: it is taken, has no effect, and a warning says so (one configuration dict or
`--command-config` file often serves every client of an application). Callers that hand one
client's settings to another (the Spark connector, the CLI) pass `only(config, kind)`."""
from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping

from oncelog.core.topic_config import ConfigError

log = logging.getLogger("oncelog.client")

# every client: where the cluster is, how to reach and authenticate to it
COMMON = frozenset({
    "bootstrap.servers", "client.id", "request.timeout.ms", "oncelog.address.map",
    "security.protocol", "sasl.mechanism", "sasl.username", "sasl.password",
    "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
})

PRODUCER = COMMON | frozenset({
    "acks", "allow.auto.create.topics", "batch.size", "buffer.memory", "compression.type",
    "delivery.timeout.ms", "enable.idempotence", "linger.ms", "max.block.ms",
    "max.in.flight.requests.per.connection", "max.request.size", "metadata.max.age.ms",
    "partitioner.adaptive.partitioning.enable", "partitioner.ignore.keys", "retries",
    "retry.backoff.ms", "transaction.timeout.ms", "transactional.id",
    "transaction.two.phase.commit.enable", "oncelog.transaction.v2.enable",
})

CONSUMER = COMMON | frozenset({
    "auto.offset.reset", "check.crcs", "fetch.max.bytes", "fetch.max.wait.ms", "fetch.min.bytes",
    "isolation.level", "max.partition.fetch.bytes",
    # groups (client/aio/group.py)
    "group.id", "group.instance.id", "group.protocol", "group.remote.assignor", "session.timeout.ms",
    "heartbeat.interval.ms", "max.poll.interval.ms", "partition.assignment.strategy",
    "enable.auto.commit", "auto.commit.interval.ms",
    "on_commit",   # confluent-kafka's commit callback, (error, partitions)
})

ADMIN = COMMON

# a share group's member (client/aio/share_consumer.py, KIP-932; confluent-kafka's ShareConsumer)
SHARE_CONSUMER = COMMON | frozenset({
    "group.id", "share.acknowledgement.mode", "max.poll.records", "fetch.max.wait.ms", "retry.backoff.ms",
})

KINDS: dict[str, frozenset[str]] = {"producer": PRODUCER, "consumer": CONSUMER, "admin": ADMIN,
                                    "share consumer": SHARE_CONSUMER}
ANY = PRODUCER | CONSUMER | ADMIN | SHARE_CONSUMER


def check(config: Mapping, kind: str) -> None:
    """ConfigError naming the first key no oncelog client knows, and the nearest known one; a key
    of another kind of client is left without effect, with a warning (as librdkafka's)."""
    known = KINDS[kind] if kind in KINDS else ANY
    for key in config:
        if key in known:
            continue
        if key in ANY:
            log.warning("configuration property %s is not a %s property: it has no effect here", key, kind)
            continue
        raise ConfigError(unknown_message(str(key), kind))


def unknown_message(key: str, kind: str = "client") -> str:
    near = difflib.get_close_matches(key, sorted(KINDS.get(kind, ANY)), n=1, cutoff=0.6) \
        or difflib.get_close_matches(key, sorted(ANY), n=1, cutoff=0.6)
    return (f'No such configuration property: "{key}"'
            + (f' (did you mean "{near[0]}"?)' if near else f" (oncelog's {kind} does not take it)"))


def only(config: Mapping, kind: str) -> dict:
    """The settings of `config` that a `kind` client takes (the others dropped)."""
    known = KINDS[kind]
    return {k: v for k, v in config.items() if k in known}
