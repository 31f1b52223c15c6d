"""Issue 25, finding 8: topic ids leaked topic names. Metadata v12 and DeleteTopics v6 name topics
by id (KIP-516); answering a principal that may not DESCRIBE the topic, oncelog put the name in the
answer. Kafka answers TOPIC_AUTHORIZATION_FAILED with a null name (ids are not secret, names are).
The other by-id paths served leak nothing: Produce v13+ answers by id alone, and Fetch is served up
to v12, by name."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic
from confluent_kafka.admin import ResourcePatternType as P
from confluent_kafka.admin import ResourceType as R
from raw_requests import call

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

CONFIG = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
          "allow.everyone.if.no.acl.found": "true"}
ME = "User:ANONYMOUS"
HIDDEN, DESCRIBED, OPEN = "payroll", "describe-only", "open"


@pytest.fixture(scope="module")
def ids(tmp_path_factory):
    """A broker where User:ANONYMOUS may not see HIDDEN (an ACL for someone else is on it), may
    only DESCRIBE DESCRIBED, and may do anything to OPEN (no ACL); the topics' ids."""
    b = BrokerProcess(tmp_path_factory.mktemp("ids") / "data", CONFIG).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for f in admin.create_topics([NewTopic(t, 1, 1) for t in (HIDDEN, DESCRIBED, OPEN)]).values():
            f.result(30)
        r = call(b.bootstrap, ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                 include_topic_authorized_operations=False)
        topic_ids = {str(t.name): t.topic_id for t in r.topics}
        for f in admin.create_acls([
                AclBinding(R.TOPIC, HIDDEN, P.LITERAL, "User:someone-else", "*", AclOperation.READ,
                           AclPermissionType.ALLOW),
                AclBinding(R.TOPIC, DESCRIBED, P.LITERAL, ME, "*", AclOperation.DESCRIBE,
                           AclPermissionType.ALLOW)]).values():
            f.result(30)
        yield b, topic_ids
    finally:
        b.stop()


def metadata_by_id(bootstrap: str, topic_id):
    mt = entities.nested(ApiKey.METADATA, 12, "request", "MetadataRequestTopic")
    r = call(bootstrap, ApiKey.METADATA, 12, topics=(mt(topic_id=topic_id, name=None),),
             allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    [t] = r.topics
    return t.name, t.error_code.value, t.topic_id


def delete_by_id(bootstrap: str, topic_id):
    dt = entities.nested(ApiKey.DELETE_TOPICS, 6, "request", "DeleteTopicState")
    r = call(bootstrap, ApiKey.DELETE_TOPICS, 6, topics=(dt(name=None, topic_id=topic_id),), timeout=30000)
    [t] = r.responses
    return t.name, t.error_code.value, t.topic_id


def test_metadata_by_id_names_no_topic_the_caller_may_not_describe(ids):
    b, topic_ids = ids
    assert metadata_by_id(b.bootstrap, topic_ids[HIDDEN]) == (None, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                             topic_ids[HIDDEN])
    assert metadata_by_id(b.bootstrap, topic_ids[DESCRIBED]) == (DESCRIBED, ErrorCode.NONE, topic_ids[DESCRIBED])
    assert metadata_by_id(b.bootstrap, topic_ids[OPEN]) == (OPEN, ErrorCode.NONE, topic_ids[OPEN])
    unknown = uuid.uuid4()
    assert metadata_by_id(b.bootstrap, unknown) == (None, ErrorCode.UNKNOWN_TOPIC_ID, unknown)


def test_delete_topics_by_id_names_no_topic_the_caller_may_not_describe(ids):
    b, topic_ids = ids
    assert delete_by_id(b.bootstrap, topic_ids[HIDDEN]) == (None, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                           topic_ids[HIDDEN])
    # DESCRIBE without DELETE: refused, and the name is the caller's to know (Kafka's answer)
    assert delete_by_id(b.bootstrap, topic_ids[DESCRIBED]) == (DESCRIBED, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                              topic_ids[DESCRIBED])
    assert list(b.data_dir.glob(f"{HIDDEN}-0")) and list(b.data_dir.glob(f"{DESCRIBED}-0"))  # both still there
    assert delete_by_id(b.bootstrap, topic_ids[OPEN]) == (OPEN, ErrorCode.NONE, topic_ids[OPEN])
