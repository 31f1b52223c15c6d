"""Who may share a data directory (storage/dir_lock.py). flock locks belong to an open file, so
two takers in one process conflict as two processes would."""
import pytest

from oncelog.storage.dir_lock import DirectoryLock, DirectoryLocked


def test_a_broker_alone_excludes_cluster_members_and_the_reverse(tmp_path):
    alone = DirectoryLock.exclusive(tmp_path, "a broker")
    with pytest.raises(DirectoryLocked, match="not starting broker 1"):
        DirectoryLock.cluster_member(tmp_path, "node-1", "broker 1")
    alone.release()
    member = DirectoryLock.cluster_member(tmp_path, "node-1", "broker 1")
    with pytest.raises(DirectoryLocked, match=r"in use by process \d+"):
        DirectoryLock.exclusive(tmp_path, "a broker")
    member.release()


def test_cluster_members_share_the_directory_but_not_a_node_id(tmp_path):
    one = DirectoryLock.cluster_member(tmp_path, "node-1", "broker 1")
    two = DirectoryLock.cluster_member(tmp_path, "node-2", "broker 2")
    with pytest.raises(DirectoryLocked, match=r"\.lock\.node-2"):
        DirectoryLock.cluster_member(tmp_path, "node-2", "broker 2")
    two.release()
    DirectoryLock.cluster_member(tmp_path, "node-2", "broker 2").release()
    one.release()


def test_a_refused_taker_holds_nothing(tmp_path):
    other = DirectoryLock.cluster_member(tmp_path, "node-2", "broker 2")
    with pytest.raises(DirectoryLocked):
        DirectoryLock.cluster_member(tmp_path, "node-2", "broker 2")
    other.release()
    # the refused attempt's shared lock on .lock was let go: a single broker may now take it
    DirectoryLock.exclusive(tmp_path, "a broker").release()
