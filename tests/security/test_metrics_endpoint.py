"""Issue 36, finding 6: the metrics port named what ACLs hide (`oncelog_log_end_offset{topic=
"secret-payroll-2026"}`, committed offsets and lag per group) to anyone who reached it, and its
scrapes read the coordinators from their own thread, through `listing()` -> `reconcile()`, loading
and unloading groups off the event loop. Now: scrapes render a snapshot taken on the event loop
that changes nothing; `metrics.resource.labels.enable=false` drops topic, partition and group
labels; `metrics.web.config.file` adds TLS and basic authentication in the Prometheus exporters'
web-config format. The endpoint binds 127.0.0.1 by default (as before).

In-process brokers over real sockets; scrapes from another thread, as Prometheus's would come."""
from __future__ import annotations

import asyncio
import base64
import ssl
import threading
import urllib.error
import urllib.request

import bcrypt
import pytest

from oncelog.broker.config import BrokerConfig
from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode as E
from oncelog.testing.in_process import InProcessBroker
from oncelog.testing.raw_client import AsyncRawConnection
from oncelog.testing.tls import make_pki

SECRET, GROUP = "secret-payroll-2026", "payroll-readers"


async def started(tmp_path, **extra: str) -> tuple[InProcessBroker, AsyncRawConnection]:
    """A broker with a topic and a group that committed an offset on it."""
    broker = InProcessBroker(BrokerConfig({"log.dirs": str(tmp_path / "data"), "node.id": "1",
                                           "listeners": "PLAINTEXT://127.0.0.1:0", "metrics.port": "0", **extra}))
    host, port = (await broker.start())[:2]
    c = await AsyncRawConnection.open(host, port)
    ct = entities.nested(ApiKey.CREATE_TOPICS, 7, "request", "CreatableTopic")
    r = await c.call(ApiKey.CREATE_TOPICS, 7, topics=(ct(name=SECRET, num_partitions=1, replication_factor=1,
                                                         assignments=(), configs=()),),
                     timeout=10000, validate_only=False)
    assert int(r.topics[0].error_code) == E.NONE
    tp = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestTopic")
    pp = entities.nested(ApiKey.OFFSET_COMMIT, 8, "request", "OffsetCommitRequestPartition")
    r = await c.call(ApiKey.OFFSET_COMMIT, 8, group_id=GROUP, generation_id_or_member_epoch=-1, member_id="",
                     group_instance_id=None, topics=(tp(name=SECRET, partitions=(pp(
                         partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                         committed_metadata=""),)),))
    assert int(r.topics[0].partitions[0].error_code) == E.NONE
    return broker, c


def get(url: str, context: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


async def test_a_scrape_reads_a_snapshot_taken_on_the_event_loop_and_loads_nothing(tmp_path):
    broker, c = await started(tmp_path)
    loop_thread = threading.get_ident()
    calls: list[tuple[str, int]] = []
    groups = broker.groups
    for owner, name in ((groups, "reconcile"), (groups, "listing"), (groups.consumer, "reconcile"),
                        (groups.consumer, "listing")):
        real = getattr(owner, name)

        def recorded(*a, _real=real, _name=name, **kw):
            calls.append((_name, threading.get_ident()))
            return _real(*a, **kw)
        setattr(owner, name, recorded)
    try:
        url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
        status, text = await asyncio.to_thread(get, url)
        assert status == 200
        assert f'oncelog_consumer_group_committed_offset{{group="{GROUP}",partition="0",topic="{SECRET}"}}' in text
        assert not [n for n, thread in calls if thread != loop_thread], "a scrape ran coordinator code off the loop"
        assert not calls, "a scrape loaded or listed groups (it reads what the coordinators hold)"
        # a second scrape at once: a fresh snapshot, taken a second after the first
        assert (await asyncio.to_thread(get, url))[0] == 200
    finally:
        await c.close()
        await broker.stop()


async def test_resource_labels_can_be_dropped(tmp_path):
    broker, c = await started(tmp_path, **{"metrics.resource.labels.enable": "false"})
    try:
        status, text = await asyncio.to_thread(get, f"http://127.0.0.1:{broker.metrics_port}/metrics")
        assert status == 200
        assert SECRET not in text and GROUP not in text and 'topic="' not in text
        assert "oncelog_log_size_bytes " in text and "oncelog_consumer_group_lag " in text
    finally:
        await c.close()
        await broker.stop()


async def test_tls_and_basic_authentication_in_the_exporters_web_config_format(tmp_path):
    pki = make_pki(tmp_path / "pki")
    hashed = bcrypt.hashpw(b"scrape-pw", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"""# the Prometheus exporter-toolkit's format
tls_server_config:
  cert_file: {pki.broker_pem()}
  key_file: {pki.broker_pem()}
basic_auth_users:
  prometheus: '{hashed}'
""")
    broker, c = await started(tmp_path, **{"metrics.web.config.file": str(web)})
    trusting = ssl.create_default_context(cafile=str(pki.ca))
    url = f"https://localhost:{broker.metrics_port}/metrics"
    try:
        assert (await asyncio.to_thread(get, url, trusting))[0] == 401
        assert (await asyncio.to_thread(get, url, trusting, ("prometheus", "wrong")))[0] == 401
        assert (await asyncio.to_thread(get, url, trusting, ("nobody", "scrape-pw")))[0] == 401
        status, text = await asyncio.to_thread(get, url, trusting, ("prometheus", "scrape-pw"))
        assert status == 200 and "oncelog_requests_total" in text
        with pytest.raises(Exception):  # noqa: B017 - plain HTTP to the TLS port: no answer
            await asyncio.to_thread(get, f"http://127.0.0.1:{broker.metrics_port}/metrics")
    finally:
        await c.close()
        await broker.stop()
