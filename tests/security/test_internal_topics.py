"""Issue 25, finding 2: internal topics were writable. A principal with WRITE on TOPIC:* produced a
forged record to `__transaction_state`; after a restart the coordinator "completed" another
producer's transaction from it and its uncommitted records became visible to read_committed
readers. Kafka refuses any client append to an internal topic (INVALID_TOPIC_EXCEPTION), whatever
the ACLs say; oncelog now does, and keeps clients from creating, deleting, growing or un-compacting
the topics its coordinators own (`broker.security.internal_topics`). Each test is the attack, with raw
requests where a client library would not send them, against a real `oncelog serve`."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as TP
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from raw_requests import call, eventually, fetch_records, produce, wait_for_log

from oncelog.core.txn.log_format import decode_key, decode_value, encode_value
from oncelog.core.txn.state import TxnState
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.records import Record, encode_batch
from oncelog.testing.embedded import BrokerProcess

pytestmark = pytest.mark.processes

STATE = "__transaction_state"
ONE_STATE_PARTITION = {"transaction.state.log.num.partitions": "1"}
AUTHORIZER = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "allow.everyone.if.no.acl.found": "true"}
REFUSED = r"Cannot {} internal topic {}: refused to User:ANONYMOUS from /127\.0\.0\.1"


def on_every_topic(operation: AclOperation) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:ANONYMOUS", "*", operation,
                      AclPermissionType.ALLOW)


def create_topic(admin: AdminClient, name: str) -> None:
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)


def admin_error(future) -> int:
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    return refused.value.args[0].code()


def txn_state(bootstrap: str, tid: str) -> str:
    return call(bootstrap, ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(tid,)).transaction_states[0] \
        .transaction_state


def read_committed(bootstrap: str, topic: str, until: bytes) -> list[bytes]:
    """Every value a read_committed consumer reads from the start of partition 0 up to `until`."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "isolation.level": "read_committed",
                  "enable.auto.commit": False})
    c.assign([TP(topic, 0, 0)])
    seen: list[bytes] = []
    try:
        deadline = time.monotonic() + 60
        while until not in seen and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                seen.append(m.value())
    finally:
        c.close()
    return seen


def test_a_forged_transaction_state_record_is_refused_and_cannot_complete_another_producers_transaction(tmp_path):
    b = BrokerProcess(tmp_path / "data", {**AUTHORIZER, **ONE_STATE_PARTITION}).start()
    try:
        bs = b.bootstrap
        admin = AdminClient({"bootstrap.servers": bs})
        # the attacker's rights, as reported: WRITE (and READ) on TOPIC:*
        for f in admin.create_acls([on_every_topic(AclOperation.WRITE), on_every_topic(AclOperation.READ)]).values():
            f.result(30)
        create_topic(admin, "orders")
        victim = Producer({"bootstrap.servers": bs, "transactional.id": "victim", "linger.ms": 0,
                           "transaction.timeout.ms": 60000})
        victim.init_transactions(30)
        victim.begin_transaction()
        for value in (b"uncommitted-1", b"uncommitted-2"):
            victim.produce("orders", value, partition=0)
        assert victim.flush(30) == 0

        # the attacker reads the victim's Ongoing state and forges its PrepareCommit
        end, records = fetch_records(bs, STATE, 0)
        key, value = [(k, v) for k, v in records if k is not None and decode_key(k) == "victim"][-1]
        ongoing = decode_value("victim", value)
        assert ongoing is not None and ongoing.state == TxnState.ONGOING and ("orders", 0) in ongoing.partitions
        forged = encode_value(ongoing.evolve(state=TxnState.PREPARE_COMMIT))
        answer = produce(bs, STATE, 0, bytes(encode_batch([Record(0, int(time.time() * 1000), key, forged)])))
        assert answer.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION, answer
        assert answer.error_message == f"Cannot append to internal topic {STATE}"
        wait_for_log(b.log_file, REFUSED.format("append to", STATE))
        # a client library's producer is answered the same
        outcome: list = []
        p = Producer({"bootstrap.servers": bs, "message.timeout.ms": 10000})
        p.produce(STATE, b"forged", partition=0, on_delivery=lambda err, _m: outcome.append(err))
        p.flush(20)
        assert outcome and outcome[0] is not None and outcome[0].code() == KafkaError.TOPIC_EXCEPTION, outcome
        assert fetch_records(bs, STATE, 0)[0] == end        # nothing was appended

        # a crash and restart: the coordinator loads only what it wrote itself
        b.kill()
        b.start()
        bs = b.bootstrap
        assert eventually(lambda: txn_state(bs, "victim"), "loaded by the coordinator") == "Ongoing"
        victim.abort_transaction(60)
        checker = Producer({"bootstrap.servers": bs, "transactional.id": "checker", "linger.ms": 0})
        checker.init_transactions(30)
        checker.begin_transaction()
        checker.produce("orders", b"committed", partition=0)
        checker.commit_transaction(30)
        assert read_committed(bs, "orders", until=b"committed") == [b"committed"]
    finally:
        b.stop()


@pytest.fixture(scope="module")
def plain_broker(tmp_path_factory):
    """No authorizer: every client may do everything a client may do."""
    b = BrokerProcess(tmp_path_factory.mktemp("internal") / "data", ONE_STATE_PARTITION).start()
    yield b
    b.stop()


def test_no_client_creates_an_internal_topic_and_metadata_auto_creation_does_not_either(plain_broker):
    bs, data = plain_broker.bootstrap, plain_broker.data_dir
    admin = AdminClient({"bootstrap.servers": bs})
    for name in (STATE, "__consumer_offsets", "__share_group_state", "__cluster_metadata"):
        assert admin_error(admin.create_topics([NewTopic(name, 1, 1)])[name]) == KafkaError.INVALID_REQUEST
        wait_for_log(plain_broker.log_file, REFUSED.format("create", name))
        r = call(bs, ApiKey.METADATA, 9, topics=(entities.nested(ApiKey.METADATA, 9, "request", "MetadataRequestTopic")(
            name=name),), allow_auto_topic_creation=True, include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False)
        assert r.topics[0].error_code.value == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, r.topics[0]
        assert not list(data.glob(f"{name}-*")), name   # no partition directory was made
    # its coordinator creates it, compacted, when a transactional id needs it
    r = call(bs, ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("t",))
    assert r.coordinators[0].error_code.value == 0
    res = ConfigResource(ResourceType.TOPIC, STATE)
    assert admin.describe_configs([res])[res].result(30)["cleanup.policy"].value == "compact"


@pytest.fixture(scope="module")
def with_state(tmp_path_factory):
    """No authorizer, and `__transaction_state` holds a record (its coordinator's)."""
    b = BrokerProcess(tmp_path_factory.mktemp("with-state") / "data", ONE_STATE_PARTITION).start()
    try:
        assert init_producer_id(b.bootstrap, "holder")[0] == 0
        yield b
    finally:
        b.stop()


def init_producer_id(bootstrap: str, tid: str) -> tuple[int, int, int]:
    """(error, producer id, epoch), past COORDINATOR_LOAD_IN_PROGRESS while the topic is made."""
    def attempt():
        r = call(bootstrap, ApiKey.INIT_PRODUCER_ID, 3, transactional_id=tid, transaction_timeout=60000,
                 producer_id=-1, producer_epoch=-1)
        return None if r.error_code.value == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS else r
    r = eventually(attempt, "past COORDINATOR_LOAD_IN_PROGRESS")
    return r.error_code.value, int(r.producer_id), int(r.producer_epoch)


def test_no_client_deletes_grows_or_empties_an_internal_topic(with_state):
    bs = with_state.bootstrap
    admin = AdminClient({"bootstrap.servers": bs})
    assert admin_error(admin.delete_topics([STATE])[STATE]) == KafkaError.TOPIC_EXCEPTION
    wait_for_log(with_state.log_file, REFUSED.format("delete", STATE))
    assert admin_error(admin.create_partitions([NewPartitions(STATE, 5)])[STATE]) == KafkaError.TOPIC_EXCEPTION
    wait_for_log(with_state.log_file, REFUSED.format("add partitions to", STATE))
    [deleted] = admin.delete_records([TP(STATE, 0, -1)]).values()
    assert admin_error(deleted) == KafkaError.TOPIC_EXCEPTION
    wait_for_log(with_state.log_file, REFUSED.format("delete records of", STATE))
    # still there: one partition, the coordinator's records from offset 0
    r = call(bs, ApiKey.METADATA, 9, topics=None, allow_auto_topic_creation=False,
             include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
    assert [len(t.partitions) for t in r.topics if t.name == STATE] == [1]
    assert fetch_records(bs, STATE, 0)[1], "the coordinator's records are gone"


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_an_internal_topics_cleanup_policy_stays_compact_and_its_other_configs_alter_as_in_kafka(with_state):
    admin = AdminClient({"bootstrap.servers": with_state.bootstrap})
    res = ConfigResource(ResourceType.TOPIC, STATE)
    to_delete = ConfigResource(ResourceType.TOPIC, STATE, incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)])
    assert admin_error(admin.incremental_alter_configs([to_delete])[to_delete]) == KafkaError.INVALID_CONFIG
    wait_for_log(with_state.log_file, REFUSED.format("set cleanup.policy=delete on", STATE))
    dropped = ConfigResource(ResourceType.TOPIC, STATE, incremental_configs=[
        ConfigEntry("cleanup.policy", None, incremental_operation=AlterConfigOpType.DELETE)])
    assert admin_error(admin.incremental_alter_configs([dropped])[dropped]) == KafkaError.INVALID_CONFIG
    # the legacy AlterConfigs replaces every override: one without cleanup.policy drops compaction
    legacy = ConfigResource(ResourceType.TOPIC, STATE, set_config={"segment.bytes": "1048576"})
    assert admin_error(admin.alter_configs([legacy])[legacy]) == KafkaError.INVALID_CONFIG
    assert admin.describe_configs([res])[res].result(30)["cleanup.policy"].value == "compact"
    # what Kafka lets an operator tune stays tunable
    tuned = ConfigResource(ResourceType.TOPIC, STATE, incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([tuned])[tuned].result(30)
    assert admin.describe_configs([res])[res].result(30)["min.compaction.lag.ms"].value == "1000"


def test_a_client_cannot_add_an_internal_topic_to_its_transaction(with_state):
    bs = with_state.bootstrap
    code, pid, epoch = init_producer_id(bs, "joiner")
    assert code == 0
    topic = entities.nested(ApiKey.ADD_PARTITIONS_TO_TXN, 3, "request", "AddPartitionsToTxnTopic")
    r = call(bs, ApiKey.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id="joiner",
             v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
             v3_and_below_topics=(topic(name=STATE, partitions=(0,)),
                                  topic(name="__consumer_offsets", partitions=(0,))))
    codes = {t.name: [p.partition_error_code.value for p in t.results_by_partition]
             for t in r.results_by_topic_v3_and_below}
    assert codes == {STATE: [ErrorCode.TOPIC_AUTHORIZATION_FAILED],
                     "__consumer_offsets": [ErrorCode.TOPIC_AUTHORIZATION_FAILED]}
    assert txn_state(bs, "joiner") == "Empty"    # nothing joined


def test_metadata_marks_internal_topics(with_state):
    bs = with_state.bootstrap
    admin = AdminClient({"bootstrap.servers": bs})
    create_topic(admin, "ordinary")
    r = call(bs, ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
             include_topic_authorized_operations=False)
    internal = {t.name: t.is_internal for t in r.topics}
    assert internal[STATE] is True and internal["ordinary"] is False
