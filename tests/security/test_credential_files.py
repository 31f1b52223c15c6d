"""Issue 36 (suspected from reading, confirmed here): `read_private` checked a credential file's
mode but not its owner, and the cluster credential was written to `.cluster.credential.<pid>.tmp`
opened as found (a file or link planted there by another user got the password). Durable writes
now create their temporary files (O_EXCL|O_NOFOLLOW, `storage.durable`), under a name nobody can
plant for `create_exclusive`, and a secret file must belong to its reader."""
from __future__ import annotations

import os

import pytest

from oncelog.storage import cluster_credential, durable
from oncelog.storage.cluster_credential import CredentialFileError


def test_a_planted_temporary_file_or_link_never_receives_the_credential(tmp_path):
    path = cluster_credential.path_in(tmp_path)
    planted = tmp_path / f".{path.name}.{os.getpid()}.tmp"          # the name it used to write to
    planted.write_text("")
    os.chmod(planted, 0o666)
    credential = cluster_credential.load_or_create(path)
    assert credential.password not in planted.read_text()
    assert os.stat(path).st_mode & 0o777 == 0o600 and not os.path.samefile(path, planted)


def test_replace_file_never_writes_through_a_planted_temporary(tmp_path):
    target = tmp_path / "snapshot.json"
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    durable.tmp_path(target).symlink_to(victim)
    durable.replace_file(target, "secret", mode=0o600)
    assert victim.read_text() == "untouched"
    assert target.read_text() == "secret" and not target.is_symlink() and os.stat(target).st_mode & 0o777 == 0o600
    planted = durable.tmp_path(target)
    planted.write_text("")
    os.chmod(planted, 0o666)
    durable.replace_file(target, "second", mode=0o600)
    assert os.stat(target).st_mode & 0o777 == 0o600 and target.read_text() == "second"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_credential_file_of_another_user_is_refused_whatever_its_mode(tmp_path):
    path = cluster_credential.path_in(tmp_path)
    cluster_credential.load_or_create(path)
    os.chown(path, 65534, 65534)        # nobody's, still 0600
    with pytest.raises(CredentialFileError, match="belongs to uid 65534"):
        cluster_credential.load(path)
