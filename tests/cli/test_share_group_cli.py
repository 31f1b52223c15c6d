"""`oncelog consume --share-group G` (KIP-932): console consumers of one share group share the
records, each printed by one of them (a newcomer saw two `consume -g` each print all 40: a
classic group id only names where offsets are committed); `oncelog share-group list|describe`."""
from __future__ import annotations

import subprocess
import sys

import pytest
from oncelog_cli import oncelog

from oncelog.protocol import entities
from oncelog.protocol.api import ApiKey
from oncelog.testing.raw_client import RawConnection

pytestmark = pytest.mark.processes


def test_two_share_group_consoles_print_each_record_once(shared_broker, unique_topic):
    b, t, g = shared_broker.bootstrap, unique_topic, f"{unique_topic}-sharers"
    assert oncelog("topic", "create", t, bootstrap=b).code == 0
    res = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterConfigsResource")
    cfg = entities.nested(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "request", "AlterableConfig")
    r = RawConnection(b).call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, validate_only=False, resources=(res(
        resource_type=32, resource_name=g, configs=(
            cfg(name="share.auto.offset.reset", config_operation=0, value="earliest"),)),))
    assert int(r.responses[0].error_code) == 0
    assert oncelog("produce", t, stdin="".join(f"v{i}\n" for i in range(40)), bootstrap=b).code == 0
    argv = [sys.executable, "-m", "oncelog.cli.main", "consume", t, "--share-group", g, "-n", "20",
            "--format", "%o\\n", "--bootstrap-server", b]
    consoles = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [c.communicate(timeout=120) for c in consoles]
    assert all(c.returncode == 0 for c in consoles), [e for _o, e in outs]
    printed = [[int(x) for x in o.split()] for o, _e in outs]
    assert all(len(p) == 20 for p in printed)
    assert sorted(printed[0] + printed[1]) == list(range(40))
    listed = {x["group"]: x["state"] for x in oncelog("share-group", "list", "--format", "json", bootstrap=b).json()}
    assert listed.get(g) == "Empty"
    d = oncelog("share-group", "describe", g, "--format", "json", bootstrap=b).json()
    assert (d["type"], d["state"], d["members"]) == ("share", "Empty", [])
    assert oncelog("share-group", "delete", g, bootstrap=b).code == 0
    assert g not in {x["group"] for x in oncelog("share-group", "list", "--format", "json", bootstrap=b).json()}
