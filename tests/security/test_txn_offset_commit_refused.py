"""Issue 36 (suspected from reading, confirmed here): TxnOffsetCommit v5 (Transactions V2) added
the group's `__consumer_offsets` partition to the transaction even when every topic of the request
was refused. Kafka answers such a request without calling the coordinator: the transaction stays
as it was. In-process broker with an authorizer over real sockets, raw requests."""
from __future__ import annotations

import asyncio
import time

from oncelog.broker.config import BrokerConfig
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.in_process import InProcessBroker
from oncelog.testing.raw_client import AsyncRawConnection

TID, GROUP, SECRET = "copier", "copiers", "secret"


async def test_a_txn_offset_commit_refused_for_every_topic_leaves_the_transaction_alone(tmp_path):
    broker = InProcessBroker(BrokerConfig({
        "log.dirs": str(tmp_path / "data"), "node.id": "1", "listeners": "PLAINTEXT://127.0.0.1:0",
        "transaction.state.log.num.partitions": "1", "authorizer.class.name": "StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "true"}))
    host, port = (await broker.start())[:2]
    c = await AsyncRawConnection.open(host, port)
    try:
        ct = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic")
        r = await c.call(ApiKey.CREATE_TOPICS, 7, timeout=10000, validate_only=False, topics=(
            ct(name=SECRET, num_partitions=1, replication_factor=1, assignments=(), configs=()),))
        assert int(r.topics[0].error_code) == E.NONE
        # an ACL for someone else: User:ANONYMOUS may no longer read SECRET
        acl = entities.nested(ApiKey.CREATE_ACLS, 3, "request", "AclCreation")
        r = await c.call(ApiKey.CREATE_ACLS, 3, creations=(acl(
            resource_type=2, resource_name=SECRET, resource_pattern_type=3, principal="User:someone-else", host="*",
            operation=3, permission_type=3),))
        assert int(r.results[0].error_code) == E.NONE
        deadline = time.monotonic() + 30
        while True:   # the first call creates __transaction_state
            r = await c.call(ApiKey.INIT_PRODUCER_ID, 4, transactional_id=TID, transaction_timeout=60000,
                             producer_id=-1, producer_epoch=-1)
            if int(r.error_code) != E.COORDINATOR_LOAD_IN_PROGRESS or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert int(r.error_code) == E.NONE
        pid, epoch = int(r.producer_id), int(r.producer_epoch)
        t = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 5, "request", "TxnOffsetCommitRequestTopic")
        p = entities.nested(ApiKey.TXN_OFFSET_COMMIT, 5, "request", "TxnOffsetCommitRequestPartition")
        r = await c.call(ApiKey.TXN_OFFSET_COMMIT, 5, transactional_id=TID, group_id=GROUP, producer_id=pid,
                         producer_epoch=epoch, generation_id=-1, member_id="", group_instance_id=None,
                         topics=(t(name=SECRET, partitions=(p(partition_index=0, committed_offset=7,
                                                             committed_leader_epoch=-1, committed_metadata=""),)),))
        assert int(r.topics[0].partitions[0].error_code) == E.TOPIC_AUTHORIZATION_FAILED
        r = await c.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(TID,))
        state = r.transaction_states[0]
        assert state.transaction_state == "Empty" and not state.topics, state
    finally:
        await c.close()
        await broker.stop()
