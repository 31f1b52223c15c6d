"""KIP-730 producer-id blocks served: the controller and a broker's ProducerIdManager, mirroring
Kafka's ProducerIdManagerTest and ProducerIdsIntegrationTest.testUniqueProducerIds (the
controller's decisions are tests/core/test_producer_ids.py, its log tests/storage/test_metadata_log.py)."""
import asyncio

import pytest

from oncelog.broker.cluster.controller_client import ControllerClient
from oncelog.broker.cluster.producer_id_manager import ProducerIdManager
from oncelog.controller.service import Controller, ControllerConfig
from oncelog.core.controller_state import ProducerIdsBlock
from oncelog.protocol import headers, init_producer_id
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.testing.embedded import PASSWORD, USER, BrokerProcess, ControllerProcess, broker_overrides
from oncelog.testing.raw_client import RawConnection

# ---------------------------------------------------------------- controller + ProducerIdManager

async def start_controller(tmp_path, **kw):
    c = Controller(ControllerConfig(str(tmp_path / "meta"), users={USER: PASSWORD, "guest": "pw"},
                                    cluster_principals={USER}, **kw))
    host, port = await c.start()
    return c, host, port


async def manager_for(host, port, broker_id=1, user=USER, password=PASSWORD, prefetch=True):
    reg = ControllerClient(host, port, user, password)
    r = await reg.request(ApiKey.BROKER_REGISTRATION, 1, broker_id=broker_id, cluster_id="c", incarnation_id=None,
                          listeners=(), features=(), rack=None, is_migrating_zk_broker=False)
    epoch = int(r.broker_epoch)
    return ProducerIdManager(ControllerClient(host, port, user, password), broker_id, lambda: epoch,
                             prefetch=prefetch), epoch


async def test_prefetch_at_90_percent_so_callers_never_wait(tmp_path):
    c, host, port = await start_controller(tmp_path)
    try:
        m, _ = await manager_for(host, port)
        ids = [await m.generate_producer_id() for _ in range(901)]
        assert ids == list(range(901))
        deadline = asyncio.get_running_loop().time() + 5
        while m.next_block is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert m.next_block == ProducerIdsBlock(1, 1000, 1000)  # fetched before the block ran out
        more = [await m.generate_producer_id() for _ in range(200)]
        assert more == list(range(901, 1101))
    finally:
        await c.stop()


async def test_concurrent_callers_get_unique_ids(tmp_path):
    c, host, port = await start_controller(tmp_path)
    try:
        m, _ = await manager_for(host, port)

        async def one():
            for _ in range(20):
                try:
                    return await m.generate_producer_id()
                except KafkaProtocolError as e:
                    assert e.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
                    await asyncio.sleep(0.01)
        ids = await asyncio.gather(*(one() for _ in range(3000)))
        assert len(set(ids)) == 3000
    finally:
        await c.stop()


async def test_retriable_error_when_empty_and_backoff_after_errors(tmp_path):
    c, host, port = await start_controller(tmp_path)
    m, _ = await manager_for(host, port, prefetch=False)
    assert await m.generate_producer_id() == 0
    await c.stop()  # the controller goes away: the block is all there is
    for _ in range(999):
        await m.generate_producer_id()
    with pytest.raises(KafkaProtocolError) as e:
        await m.generate_producer_id()
    assert e.value.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert m._backoff_ms >= 50


async def test_stale_epoch_gets_stale_broker_epoch(tmp_path):
    c, host, port = await start_controller(tmp_path)
    try:
        _, epoch = await manager_for(host, port)
        client = ControllerClient(host, port, USER, PASSWORD)
        r = await client.request(ApiKey.ALLOCATE_PRODUCER_IDS, 0, broker_id=1, broker_epoch=epoch + 5)
        assert int(r.error_code) == ErrorCode.STALE_BROKER_EPOCH
        await manager_for(host, port)  # a re-registration makes the old epoch stale too
        r = await client.request(ApiKey.ALLOCATE_PRODUCER_IDS, 0, broker_id=1, broker_epoch=epoch)
        assert int(r.error_code) == ErrorCode.STALE_BROKER_EPOCH
        client.close()
    finally:
        await c.stop()


async def test_unauthorized_caller_gets_cluster_authorization_failed(tmp_path):
    c, host, port = await start_controller(tmp_path)
    try:
        guest = ControllerClient(host, port, "guest", "pw")
        r = await guest.request(ApiKey.ALLOCATE_PRODUCER_IDS, 0, broker_id=1, broker_epoch=1)
        assert int(r.error_code) == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        guest.close()
        with pytest.raises(KafkaProtocolError) as e:
            await ControllerClient(host, port, USER, "wrong").request(ApiKey.API_VERSIONS, 0)
        assert e.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
    finally:
        await c.stop()


@pytest.mark.processes
def test_broker_without_cluster_rights_stops_with_a_clear_message(tmp_path):
    c = ControllerProcess(tmp_path / "meta", extra_users=["guest:pw"]).start()
    try:
        b = BrokerProcess(tmp_path / "b", broker_overrides(c, 1, "guest", "pw"))
        with pytest.raises(RuntimeError):
            b.start(timeout_s=20)
        assert "no cluster rights" in b.log_tail()
    finally:
        c.stop()


# ---------------------------------------------------------------- ProducerIdsIntegrationTest

def init_producer_ids(bootstrap: str, n: int) -> list[int]:
    """n InitProducerId v4 requests pipelined on one connection; retried on error 14."""
    body = init_producer_id.encode_request(4)
    out = []
    pending = n
    with RawConnection(bootstrap, timeout_s=30) as c:
        while pending:
            for _ in range(pending):
                c.send(22, 4, body)   # all sent before the first answer is read: pipelined
            retry = 0
            for _ in range(pending):
                data = c.recv_frame()
                code, pid, _epoch = init_producer_id.decode_response(4, data,
                                                                     headers.response_header_size(22, 4, data))
                if code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                    retry += 1
                else:
                    assert code == 0, code
                    out.append(pid)
            pending = retry
    return out


def test_unique_ids_across_three_brokers_and_after_kill_9(cluster):
    controller, brokers = cluster(3)
    first = [pid for b in brokers for pid in init_producer_ids(b.bootstrap, 2000)]
    assert len(first) == 6000 and len(set(first)) == 6000
    for b in brokers:
        b.kill()
    controller.kill()
    controller.start()
    for b in brokers:
        b.start()
    second = [pid for b in brokers for pid in init_producer_ids(b.bootstrap, 500)]
    assert len(set(second)) == 1500
    assert min(second) > max(first)  # a restart never reuses an id


async def test_the_in_process_controller_continues_above_a_legacy_reservation(tmp_path):
    """KIP-730's upgrade rule for a data directory of the file allocator that preceded the
    controller (controller.embedded, as `oncelog serve` runs it)."""
    from oncelog.broker.config import BrokerConfig
    from oncelog.testing.in_process import InProcessBroker
    data = tmp_path / "data"
    data.mkdir()
    (data / "producer-id-block").write_text("5000\n")
    b = InProcessBroker(BrokerConfig({"log.dirs": str(data), "listeners": "PLAINTEXT://127.0.0.1:0"}))
    await b.start()
    try:
        assert await b.producer_ids.generate_producer_id() >= 5000
    finally:
        await b.stop()
