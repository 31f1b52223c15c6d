"""Issue 13 item 4: the controller over a metadata log under a full disk and failed fsyncs. Nothing
is answered that is not durable and no producer-id block is issued twice (the log itself:
tests/storage/test_metadata_log.py)."""
from __future__ import annotations

import asyncio

import pytest

from oncelog.broker.cluster.controller_client import ControllerClient
from oncelog.controller.service import Controller, ControllerConfig
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode
from oncelog.storage import failpoints as fp
from oncelog.testing.embedded import PASSWORD, USER, ControllerProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _failpoints_off_afterwards():
    yield
    fp.configure(None)


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
