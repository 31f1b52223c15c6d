"""Issue 25, finding 11: topic names were not validated everywhere. A CreateTopics for `../escaped`
sent to the controller was recorded, and every broker following the controller made the directory
`<data>/../escaped-0`, outside its data directory. Kafka's `Topic.validate` (1 to 249 characters of
`[a-zA-Z0-9._-]`, not `.` or `..`, else INVALID_TOPIC_EXCEPTION) now runs in one place,
`core.topic_names`, for the broker's CreateTopics (validate_only too) and Metadata auto-creation,
the controller's decision and storage, which makes no path from a name that fails it, and which a
name recorded before the check (in the controller's log or a broker's registry) never reaches."""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path

import pytest

from oncelog.broker.cluster.controller_client import ControllerClient
from oncelog.broker.config import BrokerConfig
from oncelog.controller.embedded import start_in_process
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage.log_manager import REGISTRY, LogManager
from oncelog.testing.in_process import InProcessBroker

pytestmark = pytest.mark.timeout(120)

# what Kafka's Topic.validate refuses, each for its own reason
INVALID = ["../escaped", ".", "..", "", "a" * 250, "a/b", "tab\there", "caf\u00e9", "trailing\n", "nul\x00"]


def create_topics_request(names, validate_only: bool, version: int = 7) -> dict:
    ct = entities.nested(ApiKey.CREATE_TOPICS, version, "request", "CreatableTopic")
    return dict(topics=tuple(ct(name=n, num_partitions=1, replication_factor=1, assignments=(), configs=())
                             for n in names), timeout=30000, validate_only=validate_only)


def escaped(root: Path) -> list[Path]:
    """What a name like `../escaped` made under `root` (the test's directory, around the data)."""
    return list(root.rglob("*escaped*"))


async def _wait_for(check, what: str, timeout_s: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, f"still not {what}"
        await asyncio.sleep(0.05)


# ------------------------------------------------------------------ the broker's CreateTopics and auto-creation

@pytest.fixture
async def broker(tmp_path):
    b = InProcessBroker(BrokerConfig({"log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0"}))
    host, port = await b.start()
    client = ControllerClient(host, port, None, None, client_id="attacker")
    yield b, client
    client.close()
    await b.stop()


async def test_create_topics_refuses_each_name_kafka_refuses_validate_only_or_not(broker, tmp_path):
    b, client = broker
    for validate_only in (True, False):
        r = await client.request(ApiKey.CREATE_TOPICS, 7, **create_topics_request(INVALID, validate_only))
        answers = {t.name: (t.error_code.value, t.error_message) for t in r.topics}
        for name in INVALID:
            code, message = answers[name]
            assert code == ErrorCode.INVALID_TOPIC_EXCEPTION, (name, validate_only, code)
            assert message.startswith("Topic name is invalid: "), message
    assert answers["../escaped"][1] == ("Topic name is invalid: '../escaped' contains one or more characters "
                                        "other than ASCII alphanumerics, '.', '_' and '-'")
    assert answers["a" * 250][1].endswith("is longer than the max allowed length 249")
    assert set(b.logs.topics) == set()
    assert not escaped(tmp_path)
    assert sorted(p.name for p in (tmp_path / "data").iterdir() if p.is_dir()) == ["__cluster_metadata",
                                                                                  "__consumer_offsets"]
    longest = "a" * 249
    r = await client.request(ApiKey.CREATE_TOPICS, 7, **create_topics_request([longest, "ok.name_-9"], False))
    assert [t.error_code.value for t in r.topics] == [0, 0]
    assert (tmp_path / "data" / f"{longest}-0").is_dir()


async def test_metadata_auto_creation_refuses_an_invalid_name(broker, tmp_path):
    b, client = broker
    mt = entities.nested(ApiKey.METADATA, 9, "request", "MetadataRequestTopic")
    for auto_create in (True, False):
        r = await client.request(ApiKey.METADATA, 9, topics=tuple(mt(name=n) for n in ("../escaped", "trailing\n")),
                                 allow_auto_topic_creation=auto_create, include_cluster_authorized_operations=False,
                                 include_topic_authorized_operations=False)
        assert [(t.name, t.error_code.value) for t in r.topics] == [
            ("../escaped", ErrorCode.INVALID_TOPIC_EXCEPTION), ("trailing\n", ErrorCode.INVALID_TOPIC_EXCEPTION)]
    assert set(b.logs.topics) == set()
    assert not escaped(tmp_path)


# ------------------------------------------------------------------ through the controller

@pytest.fixture
async def controller(tmp_path):
    c, reach = await start_in_process(tmp_path / "metadata")
    host, port = reach["controller.quorum.bootstrap.servers"].rsplit(":", 1)
    client = ControllerClient(host, int(port), reach["controller.sasl.plain.username"],
                              reach["controller.sasl.plain.password"])
    yield c, reach, client
    client.close()
    await c.stop()


async def clustered_broker(tmp_path: Path, reach: dict[str, str]) -> InProcessBroker:
    b = InProcessBroker(BrokerConfig({"log.dirs": str(tmp_path / "data"), "listeners": "PLAINTEXT://127.0.0.1:0",
                                      "node.id": "1", "oncelog.cluster": "true", **reach}))
    await b.start()
    return b


async def test_the_controller_refuses_an_invalid_name_and_records_nothing(controller, tmp_path):
    """The attack as reported: a CreateTopics for `../escaped` sent to the controller itself, with
    the cluster's credential, while a broker follows the controller's view."""
    c, reach, client = controller
    b = await clustered_broker(tmp_path, reach)
    try:
        r = await client.request(ApiKey.CREATE_TOPICS, 7, **create_topics_request(INVALID, False))
        assert {t.name: t.error_code.value for t in r.topics} == {n: ErrorCode.INVALID_TOPIC_EXCEPTION
                                                                  for n in INVALID}
        r = await client.request(ApiKey.CREATE_TOPICS, 7, **create_topics_request(["after"], False))
        assert r.topics[0].error_code.value == 0
        # the broker has followed the view past the refused requests
        await _wait_for(lambda: (tmp_path / "data" / "after-0").is_dir(), "leading after-0")
        assert set(c.leadership.topics) == {"after"}
        assert not [f for f in (tmp_path / "metadata").rglob("*") if f.is_file() and b"escaped" in f.read_bytes()]
        assert not escaped(tmp_path)
    finally:
        await b.stop()


async def test_a_broker_never_opens_a_recorded_topic_whose_name_is_invalid(controller, tmp_path, caplog):
    """A metadata log written before the controller checked names: the broker following it makes
    no directory for the bad name, says so once, and still leads the topics recorded after it."""
    c, reach, _client = controller
    legacy = "../escaped"
    c._commit([{"type": "topic", "name": legacy, "topic_id": str(uuid.uuid4()), "partitions": 1, "overrides": {}},
               {"type": "leader", "topic": legacy, "partition": 0, "leader": -1, "epoch": 0}])
    caplog.set_level(logging.ERROR, logger="oncelog.broker.logs.cluster_logs")
    b = await clustered_broker(tmp_path, reach)
    try:
        await b.logs.create_topic("after", 1, {}, b.now_ms())
        await _wait_for(lambda: (tmp_path / "data" / "after-0").is_dir(), "leading after-0")
        await b.logs.refresh()
        assert legacy not in b.logs.topics and not escaped(tmp_path)
        refused = [r.getMessage() for r in caplog.records if "whose name is invalid" in r.getMessage()]
        assert len(refused) == 1 and "'../escaped'" in refused[0], refused
    finally:
        await b.stop()


# ------------------------------------------------------------------ storage, whoever calls it

def test_storage_makes_no_path_from_an_invalid_name(tmp_path):
    from oncelog.storage.topic_registry import partition_dir  # (the one place a partition's path is made)
    for name in INVALID:
        with pytest.raises(KafkaProtocolError) as refused:
            partition_dir(tmp_path, name, 0)
        assert refused.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert partition_dir(tmp_path, "orders", 3) == tmp_path / "orders-3"


async def test_a_registry_entry_whose_name_is_invalid_is_not_opened_and_is_kept(tmp_path, caplog):
    data = tmp_path / "data"
    data.mkdir()
    bad = {"name": "../escaped", "topic_id": str(uuid.uuid4()), "partitions": 1, "overrides": {}}
    (data / REGISTRY).write_text(json.dumps([bad]))
    logs = LogManager([str(data)], {})
    with caplog.at_level(logging.ERROR, logger="oncelog.storage.log_manager"):
        await logs.open(0)
    try:
        assert logs.topics == {} and not (tmp_path / "escaped-0").exists()
        assert any("'../escaped' is not opened" in r.getMessage() for r in caplog.records)
        await logs.create_topic("orders", 1, {}, 0)     # saves the registry: the entry stays, as it was
        assert [t["name"] for t in json.loads((data / REGISTRY).read_text())] == ["orders", "../escaped"]
    finally:
        await logs.close()
