"""AlterConfigs (API 33), v0-v2, the legacy form: a resource's configs are replaced wholesale by
the configs given (a name left out reverts to its default), as Kafka's legacyAlterConfigs does;
validate_only checks without changing anything. A topic's overrides, or on a BROKER resource (a
broker id, or the empty name for the cluster-wide default) Kafka's dynamic broker configs
(`broker.dynamic_config`). Needs ALTER_CONFIGS on the resource (the cluster for a broker). An
internal topic's `cleanup.policy` stays `compact` (`broker.security.internal_topics`)."""
from __future__ import annotations

from oncelog.broker.handlers import incremental_alter_configs
from oncelog.broker.security import internal_topics
from oncelog.broker.security.authorization import Op, config_denied
from oncelog.core.broker_config import DELETE, SET
from oncelog.core.topic_config import parse_topic_configs
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.ALTER_CONFIGS
TOPIC, BROKER = 2, 4


async def handle(broker, version: int, request) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    responses = []
    for res in request.resources:
        rtype, rname = int(res.resource_type), str(res.resource_name)
        code: int = ErrorCode.NONE
        message: str | None = None
        try:
            denied = config_denied(broker, Op.ALTER_CONFIGS, rtype, rname)
            if denied is not None:
                raise KafkaProtocolError(denied, None)
            if rtype == BROKER:
                given = [(c.name, SET, c.value) for c in res.configs]
                names = {c.name for c in res.configs}
                dropped = [(n, DELETE, None) for n in sorted(broker.dynamic_config.store.get(rname)) if n not in names]
                await broker.dynamic_config.alter(rname, given + dropped, request.validate_only)
            elif rtype == TOPIC:
                await _replace_topic(broker, rname, res.configs, request.validate_only)
            else:
                raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, f"Unknown resource type {rtype}")
        except KafkaProtocolError as e:
            code, message = e.code, e.message
        responses.append(rb("AlterConfigsResourceResponse", error_code=code, error_message=message,
                            resource_type=rtype, resource_name=rname))
    return rb.encode(throttle_time=0, responses=tuple(responses))


async def _replace_topic(broker, topic: str, configs, validate_only: bool) -> None:
    info = broker.logs.topics.get(topic)
    if info is None:
        raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic!r}")
    wanted = {c.name: c.value for c in configs if c.value is not None}
    parse_topic_configs(wanted)
    internal_topics.check_overrides(topic, wanted)
    if not validate_only:
        await broker.logs.alter_topic_config(topic, wanted, [k for k in info.overrides if k not in wanted])


def error_response(version: int, request, code: int) -> bytes:
    return incremental_alter_configs.error_response(version, request, code, api_key=API_KEY)
