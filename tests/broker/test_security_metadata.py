"""ACLs and client quotas live in the controller's metadata log: every broker of a cluster
enforces the same ACLs (a CreateAcls sent to one broker is enforced by the other within a
heartbeat interval, and by the one that took it before it answers), and a restarted controller
serves them again. Connection limits refuse connections over `max.connections.per.ip`."""
from __future__ import annotations

import socket
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic, ResourceType

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.testing.cluster import LocalCluster
from oncelog.testing.embedded import BrokerProcess

sys.path.insert(0, str(Path(__file__).parents[1] / "compat"))
from test_authorization import ANY_ACL, AUTHORIZER, ME, call  # noqa: E402

pytestmark = pytest.mark.processes


DENIED = 29  # TOPIC_AUTHORIZATION_FAILED
NOT_CONTROLLER = 41


def metadata_error(bootstrap: str, topic: str) -> int:
    """The error the broker at `bootstrap` itself answers for `topic` (Metadata is never forwarded)."""
    t = entities.nested(ApiKey.METADATA, 12, "request", "MetadataRequestTopic")
    r = call(bootstrap, ApiKey.METADATA, 12, topics=(t(topic_id=None, name=topic),),
             allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    return r.topics[0].error_code.value


def test_every_broker_of_a_cluster_enforces_the_controllers_acls(tmp_path):
    cluster = LocalCluster(tmp_path, brokers=2, overrides={**AUTHORIZER, "allow.everyone.if.no.acl.found": "true"},
                           proxies=False).start()
    try:
        one, two = cluster.brokers[1].bootstrap, cluster.brokers[2].bootstrap
        topic = f"guarded-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": one})
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
        # no ACL on it: everyone may (once each broker knows the topic)
        wait_until(lambda: metadata_error(one, topic) == metadata_error(two, topic) == 0, "topic never seen")
        # an ACL for someone else guards the topic: the broker that took it applies it before
        # answering (sent to broker 1 itself: librdkafka's admin client picks any broker)
        grant_at(one, topic, AclOperation.READ, "User:alice")
        assert metadata_error(one, topic) == DENIED
        wait_until(lambda: metadata_error(two, topic) == DENIED, "broker 2 never applied the ACL")
        # the controller restarts from its metadata log (kill -9: what was acknowledged was fsynced)
        cluster.kill_controller()
        # while it is down, what a broker forwards is refused as retriable, not as a handler bug
        assert create_acl(two, topic, AclOperation.DESCRIBE, ME) == NOT_CONTROLLER
        cluster.start_controller()
        grant_at(two, topic, AclOperation.DESCRIBE, ME)
        assert metadata_error(two, topic) == 0
        wait_until(lambda: metadata_error(one, topic) == 0, "broker 1 never applied the second ACL")
        # and both ACLs are in the restarted controller's log, as every broker sees them
        assert len(AdminClient({"bootstrap.servers": one}).describe_acls(ANY_ACL).result(20)) == 2
    finally:
        cluster.stop()


def create_acl(bootstrap: str, topic: str, operation: AclOperation, principal: str) -> int:
    """CreateAcls (ALLOW, any host) sent to the broker at `bootstrap`: its error code."""
    creation = entities.nested(ApiKey.CREATE_ACLS, 3, "request", "AclCreation")(
        resource_type=ResourceType.TOPIC.value, resource_name=topic, resource_pattern_type=3, principal=principal,
        host="*", operation=operation.value, permission_type=3)
    return call(bootstrap, ApiKey.CREATE_ACLS, 3, creations=(creation,)).results[0].error_code.value


def grant_at(bootstrap: str, topic: str, operation: AclOperation, principal: str) -> None:
    """`create_acl`, retried while the controller is restarting (NOT_CONTROLLER)."""
    deadline = time.monotonic() + 30
    while code := create_acl(bootstrap, topic, operation, principal):
        assert code == NOT_CONTROLLER and time.monotonic() < deadline, f"CreateAcls at {bootstrap} answered {code}"
        time.sleep(0.2)


def wait_until(done, message: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def test_connections_over_max_connections_per_ip_are_closed(tmp_path):
    with BrokerProcess(tmp_path / "data", {"max.connections.per.ip": "2"}) as b:
        host, port = b.bootstrap.rsplit(":", 1)
        kept = [socket.create_connection((host, int(port)), 5) for _ in range(2)]
        extra = socket.create_connection((host, int(port)), 5)
        extra.settimeout(5)
        try:
            assert extra.recv(1) == b""                             # closed as it arrived
            for s in kept:                                          # the two before it are served
                s.settimeout(0.2)
                with pytest.raises(TimeoutError):
                    s.recv(1)
        finally:
            for s in (*kept, extra):
                s.close()
        # a closed connection frees its slot
        deadline = time.monotonic() + 10
        while True:
            again = socket.create_connection((host, int(port)), 5)
            again.settimeout(0.5)
            try:
                if again.recv(1) == b"":
                    assert time.monotonic() < deadline, "slots were never released"
                    continue
            except TimeoutError:
                break
            finally:
                again.close()
        assert "Too many connections from 127.0.0.1" in Path(b.log_file).read_text()
