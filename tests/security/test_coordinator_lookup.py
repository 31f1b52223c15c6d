"""Issue 25, finding 9: FindCoordinator created `__transaction_state` before it authorized the
caller, so anyone who could connect made the broker create (and in a cluster, make the controller
record) a 50-partition topic. Kafka checks DESCRIBE on the transactional id first and creates
the topic only for a caller it answers; so does oncelog now."""
from __future__ import annotations

import pytest
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, AdminClient, ResourcePatternType
from confluent_kafka.admin import ResourceType as R
from raw_requests import call, wait_for_log

from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

STATE = "__transaction_state"
# allow.everyone.if.no.acl.found lets User:ANONYMOUS do what has no ACL; one ACL on
# TRANSACTIONAL_ID:* for somebody else takes every transactional id away from it
CONFIG = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
          "allow.everyone.if.no.acl.found": "true", "transaction.state.log.num.partitions": "2"}


def txn_acl(name: str, principal: str) -> AclBinding:
    return AclBinding(R.TRANSACTIONAL_ID, name, ResourcePatternType.LITERAL, principal, "*", AclOperation.DESCRIBE,
                      AclPermissionType.ALLOW)


def topic_names(bootstrap: str) -> set[str]:
    r = call(bootstrap, ApiKey.METADATA, 9, topics=None, allow_auto_topic_creation=False,
             include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
    return {str(t.name) for t in r.topics}


def test_a_refused_find_coordinator_creates_no_transaction_state(tmp_path):
    b = BrokerProcess(tmp_path / "data", CONFIG).start()
    try:
        bs = b.bootstrap
        admin = AdminClient({"bootstrap.servers": bs})
        for f in admin.create_acls([txn_acl("*", "User:someone-else")]).values():
            f.result(30)
        r = call(bs, ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("stranger", "other"))
        assert [(c.key, c.error_code.value) for c in r.coordinators] == [
            ("stranger", ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
            ("other", ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)]
        r = call(bs, ApiKey.FIND_COORDINATOR, 3, key="stranger", key_type=1)
        assert r.error_code.value == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        wait_for_log(b.log_file, r"Principal = User:ANONYMOUS is Denied operation = DESCRIBE from host = 127\.0\.0\.1 "
                                 r"on resource = TRANSACTIONAL_ID:stranger")
        assert STATE not in topic_names(bs)
        assert not list(b.data_dir.glob(f"{STATE}-*"))

        # a caller allowed to ask for one id of a batch: the topic is made for that one only
        for f in admin.create_acls([txn_acl("mine", "User:ANONYMOUS")]).values():
            f.result(30)
        r = call(bs, ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("stranger", "mine"))
        codes = {c.key: c.error_code.value for c in r.coordinators}
        assert codes["stranger"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert codes["mine"] in (ErrorCode.NONE, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        assert STATE in topic_names(bs)
        assert len(list(b.data_dir.glob(f"{STATE}-*"))) == 2
    finally:
        b.stop()
