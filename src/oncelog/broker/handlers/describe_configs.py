"""DescribeConfigs (API 32), v1-v4: a topic's effective configuration with the source of each
value (topic override, dynamic broker config, broker setting, or default), and the broker's
settings with their dynamic values (`broker.dynamic_config`; read-only unless Kafka changes the
name at runtime, password values hidden), and a share group's configs (KIP-932, KIP-1191: set on
the group, GROUP_CONFIG, or the broker's default), answered by the group's coordinator, which keeps
them with the group's state (NOT_COORDINATOR elsewhere). Needs DESCRIBE_CONFIGS on the topic
(TOPIC_AUTHORIZATION_FAILED), the cluster for broker settings (CLUSTER_AUTHORIZATION_FAILED) or the
group (GROUP_AUTHORIZATION_FAILED)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from oncelog.broker.security.authorization import Op, config_denied
from oncelog.broker.services import BrokerServices
from oncelog.core.topic_config import TOPIC_CONFIGS
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_CONFIGS
TOPIC, BROKER, GROUP = 2, 4, 32
# Kafka's ConfigSource ids
TOPIC_CONFIG, DEFAULT_CONFIG, GROUP_CONFIG = 1, 5, 8
# the share-group configs' types and documentation (Kafka's GroupConfig)
_GROUP_CONFIG_DOCS = {
    "share.auto.offset.reset": ("string", "Where a share group starts reading a partition it has no state for: "
                                          "earliest or latest."),
    "share.isolation.level": ("string", "read_committed: the group reads committed transactions only; "
                                        "read_uncommitted: every record."),
    "share.record.lock.duration.ms": ("int", "How long a member holds the records it acquired."),
    "errors.deadletterqueue.topic.name": ("string", "The topic a rejected record, or one past the delivery "
                                                    "count limit, is written to (KIP-1191); blank: none."),
    "errors.deadletterqueue.copy.record.enable": ("boolean", "Whether dead-letter records carry the original "
                                                             "key and value (KIP-1191)."),
}
# Kafka's ConfigType ids
_TYPES = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7, "class": 8,
          "password": 9}


def topic_config_entries(broker: BrokerServices, topic: str
                         ) -> Iterator[tuple[str, str | None, int, str, str, bool, bool]]:
    """(name, value, source, doc, kind, read-only, sensitive) for every topic config of `topic`."""
    overrides = broker.logs.topics[topic].overrides
    effective = broker.logs.topic_config(topic)
    dynamic = broker.dynamic_config
    for name, definition in TOPIC_CONFIGS.items():
        source = TOPIC_CONFIG if name in overrides else (
            dynamic.source(definition.server_name) if definition.server_name else DEFAULT_CONFIG)
        yield name, definition.render(effective[name]), source, definition.doc, definition.kind, False, False


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    results = []
    for res in request.resources:
        rtype, rname = int(res.resource_type), str(res.resource_name)
        code, message, entries = ErrorCode.NONE, None, []
        denied = config_denied(broker, Op.DESCRIBE_CONFIGS, rtype, rname)
        if denied is not None:
            code, message = denied, None
        elif rtype == TOPIC:
            if rname in broker.logs.topics:
                entries = list(topic_config_entries(broker, rname))
            else:
                code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {rname!r}"
        elif rtype == BROKER:
            if rname in ("", str(broker.node_id)):
                entries = list(broker.dynamic_config.entries(rname))
            else:
                code, message = ErrorCode.INVALID_REQUEST, (f"Unexpected broker id, expected {broker.node_id} or "
                                                            f"empty string, but received {rname}")
        elif rtype == GROUP:
            if broker.coordinates(rname):
                entries = [(n, v, GROUP_CONFIG if own else DEFAULT_CONFIG, _GROUP_CONFIG_DOCS[n][1],
                            _GROUP_CONFIG_DOCS[n][0], False, False)
                           for n, v, own in broker.groups.share.describe_group_configs(rname)]
            else:
                code, message = ErrorCode.NOT_COORDINATOR, f"group {rname}'s configs are kept by its coordinator"
        else:
            code, message = ErrorCode.INVALID_REQUEST, f"resource type {rtype} is not supported"
        keys = set(res.configuration_keys) if res.configuration_keys is not None else None
        configs = tuple(
            rb("DescribeConfigsResourceResult", name=n, value=v, read_only=read_only,
               config_source=src, is_sensitive=sensitive, synonyms=(), config_type=_TYPES.get(kind, 0),
               documentation=doc if getattr(request, "include_documentation", False) else None,
               is_default=src == DEFAULT_CONFIG)
            for n, v, src, doc, kind, read_only, sensitive in entries if keys is None or n in keys)
        results.append(rb("DescribeConfigsResult", error_code=code, error_message=message,
                          resource_type=rtype, resource_name=rname, configs=configs))
    return rb.encode(throttle_time=0, results=tuple(results))


def error_response(version: int, request: Any, code: int) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    return rb.encode_error(code, results=tuple(
        rb.error("DescribeConfigsResult", code, error_message=None, resource_type=res.resource_type,
                 resource_name=res.resource_name)
        for res in request.resources))
