"""AlterConfigs (API 33), v0-v2, the legacy form: a topic's overrides are replaced wholesale by
the configs given (a name left out, or given with a null value, reverts to its default), as
Kafka's legacyAlterConfigs does; validate_only checks without changing anything. Broker settings
come from server.properties, as for IncrementalAlterConfigs. Needs ALTER_CONFIGS on the resource."""
from __future__ import annotations

from oncelog.broker.authorization import Op, config_denied
from oncelog.broker.handlers import incremental_alter_configs
from oncelog.core.topic_config import parse_topic_configs
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError

API_KEY = ApiKey.ALTER_CONFIGS
TOPIC = 2


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
            if rtype != TOPIC:
                raise KafkaProtocolError(ErrorCode.INVALID_REQUEST, "only topic configs can be altered "
                                         "at runtime; broker settings come from server.properties")
            info = broker.logs.topics.get(rname)
            if info is None:
                raise KafkaProtocolError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {rname!r}")
            wanted = {c.name: c.value for c in res.configs if c.value is not None}
            parse_topic_configs(wanted)
            if not request.validate_only:
                await broker.logs.alter_topic_config(rname, wanted, [k for k in info.overrides if k not in wanted])
        except KafkaProtocolError as e:
            code, message = e.code, e.message
        responses.append(rb("AlterConfigsResourceResponse", error_code=code, error_message=message,
                            resource_type=rtype, resource_name=rname))
    return rb.encode(throttle_time=0, responses=tuple(responses))


def error_response(version: int, request, code: int) -> bytes:
    return incremental_alter_configs.error_response(version, request, code, api_key=API_KEY)
