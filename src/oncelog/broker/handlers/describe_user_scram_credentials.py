"""DescribeUserScramCredentials (API 50), v0: users and their mechanisms and iterations, from the
controller (what the controller adds for brokers — the credential records — is dropped here).
Needs DESCRIBE on the cluster, as in Kafka."""
from __future__ import annotations

from typing import Any

from oncelog.broker.cluster.controller_client import ControllerUnavailable
from oncelog.broker.security.authorization import Op, authorize_cluster
from oncelog.broker.services import BrokerServices
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode

API_KEY = ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS


async def handle(broker: BrokerServices, version: int, request: Any) -> bytes:
    rb = entities.ResponseBuilder(API_KEY, version)
    if not authorize_cluster(broker, Op.DESCRIBE):
        return rb.encode(throttle_time=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                         error_message=None, results=())
    try:
        r = await broker.credentials.client().request(API_KEY, 0, users=request.users)
    except ControllerUnavailable:
        return rb.encode(throttle_time=0, error_code=ErrorCode.NOT_CONTROLLER,
                         error_message="the controller is not reachable", results=())
    results = tuple(rb("DescribeUserScramCredentialsResult", user=res.user, error_code=int(res.error_code),
                       error_message=None if int(res.error_code) == 0 else res.error_message,
                       credential_infos=tuple(rb("CredentialInfo", mechanism=int(c.mechanism),
                                                 iterations=int(c.iterations)) for c in res.credential_infos))
                    for res in r.results)
    return rb.encode(throttle_time=0, error_code=int(r.error_code), error_message=r.error_message, results=results)
