"""A secure cluster as a user starts one (issue 25, findings 1 and 3): `oncelog serve --brokers 2`
with SASL_SSL (SCRAM-SHA-512 and PLAIN over TLS), an authorizer, and every secret in a 0600
properties file. confluent-kafka and kafkajs each abort one transaction and commit another whose
partitions are led by both brokers, so the coordinator's markers and the leaders' KIP-890
verifications cross between the brokers, which log in to each other with the cluster credential
(no ACL grants them anything). Before this, such a commit never completed: the peer opened
plaintext connections to the TLS port.

And no secret is on the command line of any process the cluster runs (`/proc/<pid>/cmdline` is
readable by every local user): not the cluster credential, not the `--add-scram` password, not the
JAAS passwords. Before, the controller's command line carried the cluster password and the
`--add-scram` passwords, each broker's the cluster password and the JAAS value."""
from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from test_kafkajs import kafkajs, run_node  # noqa: F401 - the fixture, installed once per session

from oncelog.storage import cluster_credential
from oncelog.testing.secure import jaas
from oncelog.testing.tls import make_pki

pytestmark = pytest.mark.processes

SECRETS = {"admin": "admin-" + uuid.uuid4().hex, "bob": "bob-" + uuid.uuid4().hex}
TOPIC = "orders"
_READY = re.compile(r"cluster of 2 brokers.*bootstrap\.servers=(\S+)")


def children(pid: int) -> list[int]:
    """Every process descended from `pid` (from /proc: whatever the cluster started)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("secure-cluster")
    pki = make_pki(root / "pki")
    properties = root / "server.properties"
    fd = os.open(properties, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"ssl.keystore.location={pki.broker_pem()}\n"
                "sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN\n"
                f"listener.name.sasl_ssl.plain.sasl.jaas.config={jaas({'bob': SECRETS['bob']})}\n"
                f"oncelog.add.scram=SCRAM-SHA-512=[name=admin,password={SECRETS['admin']}]\n"
                "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n"
                "super.users=User:admin\n"
                "transaction.state.log.num.partitions=4\n")
    log = open(root / "cluster.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "oncelog.cli.main", "serve", str(properties), "--brokers", "2",
                             "--listeners", "SASL_SSL://127.0.0.1:0", "--log-dirs", str(root / "data")],
                            stdout=subprocess.PIPE, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log.close()
    assert proc.stdout is not None
    bootstrap = None
    deadline = time.monotonic() + 60
    while bootstrap is None and time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            break
        m = _READY.search(line)
        bootstrap = m.group(1) if m else None
    if bootstrap is None:
        proc.kill()
        pytest.fail(f"serve --brokers 2 did not start:\n{(root / 'cluster.log').read_text()[-3000:]}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    try:
        yield {"root": root, "pid": proc.pid, "ca": str(pki.ca),
               "client": {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
                          "ssl.ca.location": str(pki.ca), "sasl.mechanism": "SCRAM-SHA-512",
                          "sasl.username": "admin", "sasl.password": SECRETS["admin"]}}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def make_topic(client: dict, topic: str) -> None:
    """Two partitions; the controller places their leaders on the two brokers."""
    admin = AdminClient(client)
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while True:
        parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
        if len(parts) == 2 and {p.leader for p in parts.values()} == {1, 2}:
            return
        assert time.monotonic() < deadline, {i: p.leader for i, p in parts.items()}
        time.sleep(0.2)


def read_committed(client: dict, topic: str, count: int) -> list[tuple[int, bytes]]:
    c = Consumer({**client, "group.id": str(uuid.uuid4()), "isolation.level": "read_committed",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.value()))
        return got
    finally:
        c.close()


def test_confluent_kafka_commits_a_transaction_across_both_brokers(cluster):
    client = cluster["client"]
    topic = f"{TOPIC}-librdkafka"
    make_topic(client, topic)
    p = Producer({**client, "transactional.id": "secure-librdkafka", "linger.ms": 0})
    p.init_transactions(30)
    p.begin_transaction()
    for part in (0, 1):
        p.produce(topic, b"aborted-%d" % part, partition=part)
    assert p.flush(30) == 0
    p.abort_transaction(30)
    p.begin_transaction()
    for part in (0, 1):
        p.produce(topic, b"committed-%d" % part, partition=part)
    p.commit_transaction(30)
    assert sorted(read_committed(client, topic, 2)) == [(0, b"committed-0"), (1, b"committed-1")]


def test_kafkajs_commits_a_transaction_across_both_brokers(cluster, kafkajs):  # noqa: F811
    client = cluster["client"]
    topic = f"{TOPIC}-kafkajs"
    make_topic(client, topic)
    env = {"ONCELOG_KAFKAJS_SASL_SSL": json.dumps({"ca": cluster["ca"], "mechanism": "scram-sha-512",
                                                   "username": "admin", "password": SECRETS["admin"]})}
    bootstrap = client["bootstrap.servers"]
    run_node(kafkajs, "kafkajs_txn.js", bootstrap, "commit-abort", topic, "secure-kafkajs",
             json.dumps([[0, "aborted-0"], [1, "aborted-1"]]), json.dumps([[0, "committed-0"], [1, "committed-1"]]),
             timeout_s=120, env=env)
    out = run_node(kafkajs, "kafkajs_txn.js", bootstrap, "read", topic, f"read-{uuid.uuid4()}", "2",
                   timeout_s=120, env=env)
    assert sorted(map(tuple, out["records"])) == [(0, "committed-0"), (1, "committed-1")]
    # and as librdkafka reads it
    assert sorted(read_committed(client, topic, 2)) == [(0, b"committed-0"), (1, b"committed-1")]


def test_the_brokers_logged_in_to_each_other_as_the_cluster_principal(cluster):
    """The markers and verifications of the tests above went between the brokers over TLS, as
    the broker principal (the authorizer has no ACL for it), and none was refused."""
    logs = (cluster["root"] / "cluster.log").read_text()
    assert "authenticated User:oncelog-broker (a broker) (SCRAM-SHA-512)" in logs
    assert "is Denied operation = CLUSTER_ACTION" not in logs
    assert "WRONG_VERSION_NUMBER" not in logs   # no plaintext knocking at a TLS port


def test_no_secret_on_any_command_line(cluster):
    data = cluster["root"] / "data"
    credential_file = cluster_credential.path_in(data)
    cluster_password = cluster_credential.load(credential_file).password if credential_file.exists() \
        else json.loads((data / "cluster.json").read_text())["password"]   # where it was kept before
    secrets = [cluster_password, *SECRETS.values()]
    processes = [cluster["pid"], *children(cluster["pid"])]
    lines = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() for pid in processes}
    assert sum("oncelog.cli.main controller" in c for c in lines.values()) == 1, lines
    assert sum("oncelog.cli.main serve" in c for c in lines.values()) == 3, lines   # the parent and 2 brokers
    for pid, line in lines.items():
        for secret in secrets:
            assert secret not in line, f"process {pid} shows a secret on its command line: {line}"
    assert stat.S_IMODE(credential_file.stat().st_mode) == 0o600
    assert "password" not in (data / "cluster.json").read_text()
