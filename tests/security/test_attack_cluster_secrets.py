"""Issue 25, finding 1: secrets on command lines, and `--add-scram` at every start.

The command lines themselves are checked where a secure cluster runs
(tests/compat/test_secure_cluster.py::test_no_secret_on_any_command_line). Here: the cluster
credential's file is refused when others may read it (whoever reads it acts as a broker), and the
`--add-scram` bootstrap applies once, to a new metadata log, as `kafka-storage format --add-scram`:
a credential deleted after it leaked is not brought back by the next start with the same
server.properties."""
from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys

import pytest
from cluster_attacks import client
from confluent_kafka.admin import AdminClient, ScramMechanism, UserScramCredentialDeletion

from oncelog.protocol.api import ApiKey
from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.storage import cluster_credential
from oncelog.storage.metadata_log import MetadataLog
from oncelog.testing.embedded import BrokerProcess

ADMIN, OPS = "admin-first-password", "ops-password"
BOOTSTRAP = f"SCRAM-SHA-512=[name=admin,password={ADMIN}],SCRAM-SHA-512=[name=ops,password={OPS}]"


async def logs_in(address: str, user: str, password: str) -> bool:
    c = client(address, user, password, "SCRAM-SHA-512")
    try:
        await c.request(ApiKey.API_VERSIONS, 0)
        return True
    except KafkaProtocolError as e:
        assert e.code == ErrorCode.SASL_AUTHENTICATION_FAILED, e
        return False
    finally:
        c.close()


@pytest.mark.processes
async def test_a_deleted_bootstrap_credential_stays_deleted_across_restarts(tmp_path):
    b = BrokerProcess(tmp_path / "data", {"listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                                          "sasl.enabled.mechanisms": "SCRAM-SHA-512",
                                          "oncelog.add.scram": BOOTSTRAP}).start()
    try:
        address = f"127.0.0.1:{b.listener_ports['SASL_PLAINTEXT']}"
        assert await logs_in(address, "admin", ADMIN)
        # the admin password leaked: ops deletes the credential
        ops = AdminClient({"bootstrap.servers": address, "security.protocol": "SASL_PLAINTEXT",
                           "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ops", "sasl.password": OPS})
        for f in ops.alter_user_scram_credentials([UserScramCredentialDeletion(
                "admin", ScramMechanism.SCRAM_SHA_512)]).values():
            f.result(30)
        assert not await logs_in(address, "admin", ADMIN)
        b.restart()   # the same settings, --add-scram included
        address = f"127.0.0.1:{b.listener_ports['SASL_PLAINTEXT']}"
        assert not await logs_in(address, "admin", ADMIN)
        assert await logs_in(address, "ops", OPS)
        assert "--add-scram (oncelog.add.scram) ignored for admin, ops" in b.log_tail(200_000)
    finally:
        b.stop()


def test_format_writes_credentials_into_a_new_metadata_log_only(tmp_path, caplog):
    """What `serve --brokers N` does before its controller starts (no password reaches the
    controller's command line)."""
    from oncelog.controller.scram import format_log
    from oncelog.core.security.scram import parse_add_scram_list
    adds = parse_add_scram_list(BOOTSTRAP, secrets.token_bytes)
    assert format_log(tmp_path / "meta", adds)
    with caplog.at_level(logging.WARNING, "oncelog.controller"):
        assert not format_log(tmp_path / "meta", parse_add_scram_list(
            "SCRAM-SHA-512=[name=admin,password=changed]", secrets.token_bytes))
    assert "--add-scram (oncelog.add.scram) ignored for admin" in caplog.text
    log = MetadataLog(tmp_path / "meta", read_only=True)
    assert [(r["type"], r["name"]) for _o, r in log.read()] == [("scram_credential", "admin"),
                                                                ("scram_credential", "ops")]


@pytest.mark.processes
def test_a_cluster_credential_others_can_read_stops_the_start(tmp_path):
    data = tmp_path / "data"
    cluster_credential.load_or_create(cluster_credential.path_in(data))
    os.chmod(cluster_credential.path_in(data), 0o644)
    r = subprocess.run([sys.executable, "-m", "oncelog.cli.main", "serve", "--log-dirs", str(data),
                        "--listeners", "PLAINTEXT://127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "cluster.credential is readable by others (mode 0644)" in r.stderr, r.stderr[-2000:]


def test_the_cluster_credential_is_made_once_and_private(tmp_path):
    path = cluster_credential.path_in(tmp_path)
    first = cluster_credential.load_or_create(path)
    assert cluster_credential.load_or_create(path) == first
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert first.password not in repr(first)
