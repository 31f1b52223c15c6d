"""Issue 25, finding 4: the controller served every user's SCRAM verifier (salt, StoredKey,
ServerKey) to any user who could log in to it, through the security records feed brokers follow
(key 10000), and the cluster's topics and leaders through Metadata. With a verifier, a login as
that user follows (ServerKey forges the server's side, StoredKey plus a captured exchange the
client's). Now both feeds are the cluster principal's alone: anyone else's connection is closed.

Written as the attack: an authenticated controller user without cluster rights asks the feeds
directly, as a broker would."""
from __future__ import annotations

import json
import os
import secrets

import pytest

from oncelog.broker.cluster.controller_client import ControllerClient, ControllerUnavailable
from oncelog.controller.service import Controller, ControllerConfig
from oncelog.core.security.scram import parse_add_scram
from oncelog.protocol.api import SECURITY_RECORDS_KEY, ApiKey

CLUSTER_USER, CLUSTER_PASSWORD = "oncelog-broker", "cluster-secret"
GUEST, GUEST_PASSWORD = "guest", "guest-secret"


@pytest.fixture
async def controller(tmp_path):
    admin = parse_add_scram("SCRAM-SHA-512=[name=admin,password=admin-secret]", secrets.token_bytes)
    c = Controller(ControllerConfig(str(tmp_path / "meta"), users={CLUSTER_USER: CLUSTER_PASSWORD,
                                                                  GUEST: GUEST_PASSWORD},
                                    cluster_principals={CLUSTER_USER}, bootstrap_scram=[admin]))
    host, port = await c.start()
    yield host, port
    await c.stop()


async def read_feed(client: ControllerClient) -> dict:
    return json.loads(await client.raw(SECURITY_RECORDS_KEY, 0, json.dumps({"after": -1}).encode()))


async def test_a_controller_user_without_cluster_rights_gets_no_scram_verifiers(controller, caplog):
    host, port = controller
    guest = ControllerClient(host, port, GUEST, GUEST_PASSWORD)
    try:
        with pytest.raises(ControllerUnavailable):
            await read_feed(guest)
    finally:
        guest.close()
    assert "the security records feed from 'guest'" in caplog.text
    # the brokers' own principal still follows it, verifiers included
    broker = ControllerClient(host, port, CLUSTER_USER, CLUSTER_PASSWORD)
    try:
        scram = (await read_feed(broker))["snapshot"]["scram"]
    finally:
        broker.close()
    assert [r["name"] for r in scram] == ["admin"] and scram[0]["stored_key"]


async def test_a_controller_user_without_cluster_rights_gets_no_metadata(controller):
    host, port = controller
    guest = ControllerClient(host, port, GUEST, GUEST_PASSWORD)
    try:
        assert int((await guest.request(ApiKey.API_VERSIONS, 0)).error_code) == 0   # logged in
        with pytest.raises(ControllerUnavailable):
            await guest.request(ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                                include_topic_authorized_operations=False)
    finally:
        guest.close()


async def test_the_metadata_log_is_for_its_owners_eyes_only(tmp_path):
    """What the feed no longer gives away, the files must not either: every other local user could
    read the verifiers from the metadata log (0644) and its snapshots."""
    admin = parse_add_scram("SCRAM-SHA-512=[name=admin,password=admin-secret]", secrets.token_bytes)
    c = Controller(ControllerConfig(str(tmp_path / "meta"), users={CLUSTER_USER: CLUSTER_PASSWORD},
                                    cluster_principals={CLUSTER_USER}, bootstrap_scram=[admin]))
    await c.start()
    await c.stop()   # writes a snapshot
    meta = tmp_path / "meta"
    snapshots = list(meta.glob("snapshot-*.json"))
    assert snapshots and "stored_key" in snapshots[0].read_text()
    modes = {p.name: os.stat(p).st_mode & 0o777 for p in [meta / "metadata.log", *snapshots]}
    assert os.stat(meta).st_mode & 0o777 == 0o700 and set(modes.values()) == {0o600}, modes
