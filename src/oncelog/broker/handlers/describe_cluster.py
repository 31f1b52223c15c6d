"""DescribeCluster (API 60), v0-v1: this broker, the cluster id, and who the controller is."""
from __future__ import annotations

from oncelog.core.security.acl import ResourceType
from oncelog.core.security.authorizer import AUTHORIZED_OPERATIONS_OMITTED, all_operations
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_CLUSTER


async def handle(broker, version: int, request) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if int(getattr(request, "endpoint_type", 1)) != 1:  # 1 = brokers; 2 = controllers
        return rb.encode(throttle_time=0, error_code=ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
                         error_message="only broker endpoints are described", endpoint_type=1,
                         cluster_id=broker.cluster_id, controller_id=-1, brokers=(),
                         cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)
    # KIP-430: no authorizer is configured, so every operation the cluster resource supports
    operations = (all_operations(ResourceType.CLUSTER) if request.include_cluster_authorized_operations
                  else AUTHORIZED_OPERATIONS_OMITTED)
    me = rb("DescribeClusterBroker", broker_id=broker.node_id, host=broker.advertised_host,
            port=broker.advertised_port, rack=None)
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, error_message=None, endpoint_type=1,
                     cluster_id=broker.cluster_id, controller_id=broker.node_id, brokers=(me,),
                     cluster_authorized_operations=operations)
