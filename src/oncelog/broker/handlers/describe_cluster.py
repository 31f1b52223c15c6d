"""DescribeCluster (API 60), v0-v1: this broker, the cluster id, and who the controller is."""
from __future__ import annotations

from typing import Any

from oncelog.broker.security.authorization import CLUSTER, CLUSTER_NAME, Op, authorize_cluster, authorized_operations
from oncelog.broker.services import BrokerServices
from oncelog.core.security.authorizer import AUTHORIZED_OPERATIONS_OMITTED
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_CLUSTER


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if int(getattr(request, "endpoint_type", 1)) != 1:  # 1 = brokers; 2 = controllers
        return rb.encode(throttle_time=0, error_code=ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
                         error_message="only broker endpoints are described", endpoint_type=1,
                         cluster_id=broker.cluster_id, controller_id=-1, brokers=(),
                         cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)
    # KIP-430: the caller's operations, only for a caller that may DESCRIBE the cluster (else 0)
    operations = AUTHORIZED_OPERATIONS_OMITTED
    if request.include_cluster_authorized_operations:
        operations = (authorized_operations(broker, CLUSTER, CLUSTER_NAME)
                      if authorize_cluster(broker, Op.DESCRIBE, audit=False) else 0)
    me = rb("DescribeClusterBroker", broker_id=broker.node_id, host=broker.advertised_host,
            port=broker.advertised_port, rack=None)
    return rb.encode(throttle_time=0, error_code=ErrorCode.NONE, error_message=None, endpoint_type=1,
                     cluster_id=broker.cluster_id, controller_id=broker.node_id, brokers=(me,),
                     cluster_authorized_operations=operations)
