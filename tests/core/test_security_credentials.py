"""SCRAM credentials in the metadata log (Kafka's ScramControlManager/ScramImage rules), the
security records replayed together, and snapshots."""
import base64

import pytest

from oncelog.core.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from oncelog.core.security.credentials import REMOVE_SCRAM_RECORD, SCRAM_RECORD, Deletion, ScramCredentials, Upsertion
from oncelog.core.security.metadata import RECORD_TYPES, SecurityMetadata
from oncelog.core.security.quotas import PRODUCER_BYTE_RATE, QuotaAlteration, QuotaEntity, QuotaOp
from oncelog.core.security.scram import (
    CredentialShape,
    ScramClient,
    ScramMechanism,
    ScramServer,
    credential_from_password,
    parse_add_scram,
    salted_password,
)
from oncelog.protocol.errors import ErrorCode

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512


def upsert(name, password="pw", mech=SHA256, iterations=4096, salt=b"salt-salt-salt-1"):
    return Upsertion(name, mech.type, iterations, salt, salted_password(mech, password, salt, iterations))


def applied(store, deletions=(), upsertions=()):
    records, results = store.decide_alter(list(deletions), list(upsertions))
    for r in records:
        store.replay(r)
    return records, results


def test_upsert_then_log_in_with_what_was_stored():
    store = ScramCredentials()
    records, results = applied(store, upsertions=[upsert("alice", "alice-secret", iterations=8192)])
    assert [(r.user, r.error_code) for r in results] == [("alice", ErrorCode.NONE)]
    assert records[0]["type"] == SCRAM_RECORD and "salted" not in str(records[0])
    cred = store.lookup("alice", SHA256)
    assert cred == credential_from_password(SHA256, "alice-secret", b"salt-salt-salt-1", 8192)
    server = ScramServer(SHA256, lambda u: store.lookup(u, SHA256), lambda n: b"\1" * n, b"k")
    client = ScramClient(SHA256, "alice", "alice-secret", lambda n: b"\2" * n)
    client.verify_server_final(server.evaluate(client.final_message(server.evaluate(client.first_message()))))
    assert store.lookup("alice", SHA512) is None


def test_alter_errors_like_kafka():
    store = ScramCredentials()
    applied(store, upsertions=[upsert("bob")])
    _, results = applied(store,
                         deletions=[Deletion("nobody", 1), Deletion("", 1), Deletion("x", 9), Deletion("bob", 1)],
                         upsertions=[upsert("few", iterations=4095), upsert("many", iterations=16385),
                                     Upsertion("nopw", 1, 4096, b"s", b""), upsert("bob"),
                                     upsert("twice"), upsert("twice")])
    got = {r.user: (r.error_code, r.error_message) for r in results}
    assert got["nobody"] == (ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
    assert got[""] == (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
    assert got["x"] == (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
    assert got["few"] == (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
    assert got["many"] == (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations")
    assert got["nopw"][0] == ErrorCode.UNACCEPTABLE_CREDENTIAL
    # a user altered twice in one request fails whole, whatever the parts
    assert got["bob"] == got["twice"] == (ErrorCode.DUPLICATE_RESOURCE,
                                          "A user credential cannot be altered twice in the same request")
    assert store.lookup("bob", SHA256) is not None and store.lookup("twice", SHA256) is None


def test_deciding_changes_nothing_and_results_come_in_kafkas_order():
    store = ScramCredentials()
    applied(store, upsertions=[upsert("a"), upsert("b", mech=SHA512)])
    records, results = store.decide_alter([Deletion("a", 1)], [upsert("c"), upsert("", iterations=1)])
    assert store.lookup("a", SHA256) is not None and store.lookup("c", SHA256) is None
    assert [r.user for r in results] == ["a", "c", ""]
    assert [r["type"] for r in records] == [REMOVE_SCRAM_RECORD, SCRAM_RECORD]


def test_describe():
    store = ScramCredentials()
    applied(store, upsertions=[upsert("a", iterations=8192)])
    applied(store, upsertions=[upsert("a", mech=SHA512)])
    applied(store, upsertions=[upsert("b")])
    everyone = store.describe(None)
    assert [(r.user, r.error_code, r.credentials) for r in everyone] == [
        ("a", ErrorCode.NONE, ((1, 8192), (2, 4096))), ("b", ErrorCode.NONE, ((1, 4096),))]
    assert store.describe([]) == everyone
    some = store.describe(["b", "zed", "b2", "b2"])
    assert [(r.user, r.error_code) for r in some] == [("b", ErrorCode.NONE), ("zed", ErrorCode.RESOURCE_NOT_FOUND),
                                                      ("b2", ErrorCode.DUPLICATE_RESOURCE)]


def test_bootstrap_writes_only_what_is_missing():
    store = ScramCredentials()
    add = parse_add_scram("SCRAM-SHA-256=[name=admin,password=admin-secret]", lambda n: b"\3" * n)
    records = store.decide_bootstrap([add, add])
    assert len(records) == 1
    store.replay(records[0])
    applied(store, upsertions=[upsert("admin", "changed-later")])
    assert store.decide_bootstrap([add]) == []       # a restart with the same flag keeps the new password
    assert store.lookup("admin", SHA256) == credential_from_password(SHA256, "changed-later", b"salt-salt-salt-1")


def test_replay_checks_records():
    store = ScramCredentials()
    with pytest.raises(ValueError):
        store.replay({"type": REMOVE_SCRAM_RECORD, "name": "x", "mechanism": 1})
    for bad in ({"type": SCRAM_RECORD, "name": "x", "mechanism": 3},
                {"type": SCRAM_RECORD, "name": "", "mechanism": 1},
                {"type": SCRAM_RECORD, "name": "x", "mechanism": 1, "salt": "!!", "stored_key": "",
                 "server_key": "", "iterations": 4096},
                {"type": SCRAM_RECORD, "name": "x", "mechanism": 1}):
        with pytest.raises(ValueError):
            store.replay(bad)
    assert len(store) == 0


def test_security_metadata_replays_everything_and_snapshots():
    meta = SecurityMetadata()
    acl = AclBinding(ResourcePattern(ResourceType.TOPIC, "t", PatternType.LITERAL),
                     AccessControlEntry("User:a", "*", AclOperation.READ, AclPermissionType.ALLOW))
    records = meta.acls.decide_create([acl], lambda: "id-1")[0]
    records += meta.scram.decide_alter([], [upsert("a")])[0]
    records += meta.quotas.decide_alter([QuotaAlteration([("user", "a")], [QuotaOp(PRODUCER_BYTE_RATE, 5)])])[0]
    assert {r["type"] for r in records} <= RECORD_TYPES and all(SecurityMetadata.handles(r) for r in records)
    for r in records:
        meta.replay(r)
    again = SecurityMetadata.from_snapshot(meta.to_snapshot())
    assert again.to_snapshot() == meta.to_snapshot()
    assert len(again.acls) == 1
    assert again.scram.lookup("a", SHA256) == meta.scram.lookup("a", SHA256)
    assert again.quotas.overrides(PRODUCER_BYTE_RATE) == {QuotaEntity("a"): 5}
    assert not SecurityMetadata.handles({"type": "pid_block"})
    with pytest.raises(ValueError):
        meta.replay({"type": "pid_block"})
    with pytest.raises(ValueError):
        SecurityMetadata.from_snapshot({"version": 99})
    assert len(SecurityMetadata.from_snapshot(None).acls) == 0
    # what a snapshot holds is JSON (the metadata log's format) and has no password material
    import json
    text = json.dumps(meta.to_snapshot())
    assert base64.b64encode(salted_password(SHA256, "pw", b"salt-salt-salt-1", 4096)).decode() not in text


def test_the_shapes_of_stored_credentials_are_counted_per_mechanism():
    store = ScramCredentials()
    applied(store, upsertions=[upsert("a"), upsert("b", iterations=8192), upsert("c", salt=b"s" * 64),
                               upsert("d", mech=SHA512)])
    assert store.shapes(SHA256) == {CredentialShape(16, 4096): 1, CredentialShape(16, 8192): 1,
                                    CredentialShape(64, 4096): 1}
    assert store.shapes(SHA512) == {CredentialShape(16, 4096): 1}
    applied(store, upsertions=[upsert("b")], deletions=[Deletion("c", SHA256.type)])   # replaced, removed
    assert store.shapes(SHA256) == {CredentialShape(16, 4096): 2}
    assert ScramCredentials.from_snapshot(store.to_snapshot()).shapes(SHA256) == store.shapes(SHA256)
