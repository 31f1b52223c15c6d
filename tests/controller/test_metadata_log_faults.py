"""Issue 13 item 4: the metadata log under a full disk and failed fsyncs. Nothing is answered
that is not durable, no producer-id block is issued twice, and replay always starts again."""
from __future__ import annotations

import asyncio

import pytest

from oncelog.broker.controller_client import ControllerClient
from oncelog.controller.service import Controller, ControllerConfig
from oncelog.core.producer_ids import ControllerState
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.storage import failpoints as fp
from oncelog.storage.metadata_log import MetadataLog, MetadataLogError
from oncelog.testing.embedded import PASSWORD, USER, ControllerProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _failpoints_off_afterwards():
    yield
    fp.configure(None)


def block(next_id: int) -> dict:
    return {"type": "pid_block", "broker_id": 1, "broker_epoch": 1, "next_producer_id": next_id}


def replay(directory) -> ControllerState:
    s = ControllerState()
    for _off, r in MetadataLog(directory).read():
        s.replay(r)
    return s


@pytest.mark.parametrize("fault", ["shortwrite", "enospc", "fsync-eio"])
def test_a_failed_append_leaves_nothing_and_the_next_one_follows_the_last_durable_record(tmp_path, fault):
    log = MetadataLog(tmp_path)
    log.append([block(1000)])
    size = (tmp_path / "metadata.log").stat().st_size
    fp.configure(f"{fault}:metadata")
    with pytest.raises(MetadataLogError):
        log.append([block(2000)])
    assert (tmp_path / "metadata.log").stat().st_size == size
    assert log.end_offset == 1
    log.append([block(2000)])            # the same decision, made again, is written once
    log.append([block(3000)])
    log.close()
    assert replay(tmp_path).next_producer_id == 3000   # replay starts (no "must increase")
    assert [r["next_producer_id"] for _o, r in MetadataLog(tmp_path).read()] == [1000, 2000, 3000]


def test_a_cut_that_fails_refuses_every_later_append(tmp_path):
    log = MetadataLog(tmp_path)
    log.append([block(1000)])
    fp.configure("shortwrite:metadata,truncate-eio:metadata")
    with pytest.raises(MetadataLogError):
        log.append([block(2000)])
    fp.configure(None)
    assert log.failed
    with pytest.raises(MetadataLogError):
        log.append([block(2000)])
    log.close()
    # a restart recovers: the torn tail is cut and the log continues after the last whole record
    again = MetadataLog(tmp_path)
    assert not again.failed and again.end_offset == 1
    again.append([block(2000)])
    assert replay(tmp_path).next_producer_id == 2000


async def _allocate(client: ControllerClient, epoch: int) -> tuple[int, int]:
    r = await client.request(ApiKey.ALLOCATE_PRODUCER_IDS, 0, broker_id=1, broker_epoch=epoch)
    return int(r.error_code), int(r.producer_id_start)


async def _register(client: ControllerClient) -> int:
    r = await client.request(ApiKey.BROKER_REGISTRATION, 1, broker_id=1, cluster_id="c", incarnation_id=None,
                             listeners=(), features=(), rack=None, is_migrating_zk_broker=False)
    assert int(r.error_code) == 0
    return int(r.broker_epoch)


@pytest.mark.parametrize("fault", ["shortwrite", "fsync-eio"])
async def test_controller_answers_storage_error_and_never_issues_a_block_twice(tmp_path, fault):
    """Blocks 0..999 answered; the next one meets a full disk (or a failed fsync): the caller is
    told KAFKA_STORAGE_ERROR, and every block answered before or after, across a restart, is
    new."""
    config = ControllerConfig(str(tmp_path / "meta"), users={USER: PASSWORD}, cluster_principals={USER})
    c = Controller(config)
    host, port = await c.start()
    client = ControllerClient(host, port, USER, PASSWORD)
    answered = []
    try:
        epoch = await _register(client)
        code, first = await _allocate(client, epoch)
        assert code == 0
        answered.append(first)
        fp.configure(f"{fault}:metadata")
        code, _ = await _allocate(client, epoch)
        assert code == ErrorCode.KAFKA_STORAGE_ERROR
        for _ in range(2):
            code, first = await _allocate(client, epoch)
            assert code == 0
            answered.append(first)
    finally:
        client.close()
        await c.stop()
    assert answered == [0, 1000, 2000]
    c = Controller(config)                # replay starts, and continues above every answered id
    host, port = await c.start()
    client = ControllerClient(host, port, USER, PASSWORD)
    try:
        epoch = await _register(client)
        code, first = await _allocate(client, epoch)
        assert (code, first) == (0, 3000)
    finally:
        client.close()
        await c.stop()


@pytest.mark.processes
def test_a_controller_whose_log_cannot_be_cut_back_stops(tmp_path):
    """The broker record at registration is the first append; the block after it fails and the
    cut fails too: the standalone controller exits (a supervisor restarts it; recovery cuts the
    torn tail)."""
    c = ControllerProcess(tmp_path / "meta", log_file=tmp_path / "controller.log",
                          env={fp.ENV: "shortwrite:metadata:after=1,truncate-eio:metadata"}).start()

    async def run() -> int:
        client = ControllerClient("127.0.0.1", c.port, USER, PASSWORD)
        try:
            epoch = await _register(client)
            return (await _allocate(client, epoch))[0]
        finally:
            client.close()
    assert asyncio.run(run()) == ErrorCode.KAFKA_STORAGE_ERROR
    assert c.proc.wait(30) == 2
    c.env = {}
    c.start()
    assert asyncio.run(run()) == 0
    c.stop()
