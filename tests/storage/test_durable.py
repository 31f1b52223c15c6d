"""storage.durable: every file storage replaces, renames or links survives a power cut.

Two checks, each of which fails for a writer that renames without the helper:
- a scan of `src/oncelog` for renames, replaces and links anywhere but `storage/durable.py` (and
  the failpoint hook it calls: `failpoints.log_rename`, which only the helper may call);
- each writer run under a trace of the system calls (os.fsync, os.replace, os.rename, os.link,
  and the failpoint hooks rebound to them), judged by what a power cut keeps: a rename is on
  disk only once its directory was fsynced after it, and a replaced file's new bytes only if the
  temp file was fsynced before the rename. A writer that leaves either out fails here, as the
  bare writer at the end shows.
"""
from __future__ import annotations

import ast
import asyncio
import errno
import json
import os
from array import array
from pathlib import Path

import pytest

import oncelog
from oncelog.core.txn.partition import CompletedTxn
from oncelog.protocol.records import Record, encode_batch
from oncelog.storage import cleaner, cluster_credential, durable, group_records, txn_index
from oncelog.storage import failpoints as fp
from oncelog.storage import producer_snapshots as snaps
from oncelog.storage.group_offsets import Committed, GroupMeta, GroupOffsetStore
from oncelog.storage.group_records import RecordLog
from oncelog.storage.log import LogConfig, PartitionLog
from oncelog.storage.log_manager import LogManager
from oncelog.storage.metadata_log import MetadataLog
from oncelog.storage.partition import Partition, PartitionConfig
from oncelog.storage.segment import commit_swap, swap_names

NOW = 1_700_000_000_000
SRC = Path(oncelog.__file__).parent
HELPER = {Path("storage/durable.py")}
# The failpoint layer wraps the rename the helper makes (`durable.rename(..., via=fp.log_rename)`)
HOOKS = {Path("storage/failpoints.py")}


# ------------------------------------------------------------------ the static scan

def _renames_in(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls that rename, replace or link a file: os.replace/rename/renames/link, shutil.move,
    Path.rename(x) and Path.replace(x) (one argument: str.replace takes two), the failpoint
    hook log_rename, and such names imported from os."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            for alias in node.names:
                if alias.name in ("replace", "rename", "renames", "link", "move"):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        one_arg = len(node.args) == 1 and not node.keywords
        if owner in ("os", "shutil") and name in ("replace", "rename", "renames", "link", "move"):
            found.append((node.lineno, f"{owner}.{name}"))
        elif name == "log_rename":
            found.append((node.lineno, "failpoints.log_rename"))
        elif isinstance(func, ast.Attribute) and name in ("rename", "replace") and one_arg \
                and not isinstance(func.value, ast.Constant) and owner not in ("dataclasses",):
            found.append((node.lineno, f".{name}(...)"))
    return found


def test_no_writer_renames_without_the_helper():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel in HELPER:
            continue
        for line, what in _renames_in(ast.parse(path.read_text(), str(path))):
            if rel in HOOKS and what != "failpoints.log_rename":
                continue
            offenders.append(f"{rel}:{line}: {what}")
    assert not offenders, ("rename through storage.durable (replace_file, rename, create_exclusive), "
                           "which fsyncs the directory after it:\n" + "\n".join(offenders))


def test_the_scan_sees_every_spelling():
    code = ("import os, shutil\nfrom os import replace\nos.replace(a, b)\nos.rename(a, b)\nos.link(a, b)\n"
            "shutil.move(a, b)\np.rename(q)\np.with_suffix('.x').replace(q)\nfp.log_rename(a, b)\n"
            "s.replace('a', 'b')\ndataclasses.replace(x)\nt._replace(a=1)\n")
    assert [what for _line, what in _renames_in(ast.parse(code))] == [
        "from os import replace", "os.replace", "os.rename", "os.link", "shutil.move", ".rename(...)",
        ".replace(...)", "failpoints.log_rename"]


# ------------------------------------------------------------------ the trace

class Trace:
    """The calls that decide what a power cut keeps, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []  # (call, path, target)

    def problems(self) -> list[str]:
        """What a power cut right after the traced calls could take back."""
        out = []
        for i, (call, src, dst) in enumerate(self.events):
            if call not in ("rename", "link"):
                continue
            later = self.events[i + 1:]
            if not any(c == "fsync" and p == os.path.dirname(dst) for c, p, _ in later):
                out.append(f"{call} {src} -> {dst}: its directory is never fsynced after it")
            if src.endswith(durable.TMP_SUFFIX) and not any(
                    c == "fsync" and p == src for c, p, _ in self.events[:i]):
                out.append(f"{call} {src} -> {dst}: the file was not fsynced before it")
        return out

    def renames(self) -> list[tuple[str, str]]:
        return [(os.path.basename(s), os.path.basename(d)) for c, s, d in self.events if c in ("rename", "link")]


@pytest.fixture
def trace(monkeypatch):
    t = Trace()
    real_fsync, real_replace, real_rename, real_link = os.fsync, os.replace, os.rename, os.link

    def fsync(fd):
        t.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), ""))
        return real_fsync(fd)

    def renamer(call, real):
        def rename(src, dst, *args, **kwargs):
            result = real(src, dst, *args, **kwargs)
            t.events.append((call, os.path.abspath(os.fspath(src)), os.path.abspath(os.fspath(dst))))
            return result
        return rename

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", renamer("rename", real_replace))
    monkeypatch.setattr(os, "rename", renamer("rename", real_rename))
    monkeypatch.setattr(os, "link", renamer("link", real_link))
    fp.configure(None)  # the hooks are the os functions: now the traced ones
    yield t
    monkeypatch.undo()
    fp.configure(None)


def _batch(n: int = 2, pid: int = -1, seq: int = -1) -> bytearray:
    return bytearray(encode_batch([Record(i, NOW, b"k%d" % i, b"v", []) for i in range(n)],
                                  producer_id=pid, producer_epoch=0, base_sequence=seq))


def _partition(directory: Path) -> Partition:
    p = Partition.open("t", 0, directory, PartitionConfig.from_topic_config({}), NOW)
    for i in range(3):
        p.append_from_client(_batch(pid=7, seq=2 * i), NOW)
    return p


# One entry per writer that replaces, renames or links a file (the eight the issue counted, the
# set-asides of unreadable files, the cleaner's swap, topic deletion, the cluster credential).
def w_segment_index(d):
    log = PartitionLog.open(d / "t-0", LogConfig(), NOW)
    log.append(_batch(), NOW)
    log.segments[-1].write_index()


def w_log_start_offset(d):
    log = PartitionLog.open(d / "t-0", LogConfig(), NOW)
    log.append(_batch(), NOW)
    log.append(_batch(), NOW)
    log.delete_records_before(1)


def w_txn_index(d):
    log = PartitionLog.open(d / "t-0", LogConfig(), NOW)
    seg = log.segments[-1]
    txn_index.append(seg, CompletedTxn(1, 0, 3, True, 0))
    txn_index.append(seg, CompletedTxn(2, 4, 8, True, 4))
    txn_index.truncate_from(seg, 5)  # rewritten without the second entry


def w_txn_index_set_aside(d):
    log = PartitionLog.open(d / "t-0", LogConfig(), NOW)
    seg = log.segments[-1]
    seg.txn_index_path.write_bytes(b"\x7f" * 34)  # an unknown entry version
    txn_index.load(seg)


def w_cleaner_checkpoint(d):
    d.mkdir()
    cleaner.write_checkpoint(d, 42)


def w_cleaner_swap(d):
    log = PartitionLog.open(d / "t-0", LogConfig(), NOW)
    log.append(_batch(), NOW)
    log_cleaned, txn_cleaned = swap_names(log.directory, 0, cleaner.CLEANED)
    log_cleaned.write_bytes(b"")
    txn_cleaned.write_bytes(b"")
    commit_swap(log.directory, 0)


def w_producer_snapshot(d):
    _partition(d / "t-0").take_snapshot(sync=True, force=True)


def w_producer_snapshot_set_aside(d):
    d.mkdir()
    path = snaps.snapshot_path(d, 5)
    path.write_bytes(b"not a snapshot")
    snaps.set_aside(path, "test")


def _with_topic(d: Path, then=None, overrides=None) -> None:
    async def run() -> None:
        manager = LogManager([str(d)], {})
        await manager.open(NOW)
        await manager.create_topic("orders", 2, overrides or {}, NOW)
        if then is not None:
            await then(manager)
        await manager.close()
    asyncio.run(run())


def w_topic_registry(d):
    _with_topic(d)


def w_topic_deletion(d):
    _with_topic(d, lambda manager: manager.delete_topic("orders"))


def w_group_offsets(d):
    store = GroupOffsetStore(d)
    store.commit("g", {("t", 0): Committed(5, None)})
    store.set_meta("g", GroupMeta("consumer", 1))
    store.add_pending(7, 0, "g", {("t", 0): Committed(6, None)}, NOW)
    store.apply_marker(7, 0, 0, True, store.partition_of("g"), NOW)   # the producer's log rewritten whole


def w_group_records_compaction(d):
    """A record log compacted off the event loop (`RecordLog.begin_sync / run_sync / end_sync`,
    as the group commit drives it): the new file fsynced before its rename, the directory after
    (by the fsync that follows)."""
    d.mkdir()
    log = RecordLog.create_empty(d / "g.offsets")
    for i in range(3):
        log.append([(("offset", "x"), {"v": "m" * 4000, "i": i})], shared=False, sync=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(group_records, "COMPACT_SLACK_BYTES", 0)
        while (token := log.begin_sync(NOW)) is not None:
            log.run_sync(token)
            log.end_sync(token, None, NOW)
    assert log.generation == 1 and log.durable_end_offset == log.writes


def w_metadata_snapshot(d):
    d.mkdir()
    meta = MetadataLog(d)
    try:
        meta.append([{"type": "x"}])
        meta.write_snapshot(1, {"x": 1})
    finally:
        meta.close()


def w_metadata_snapshot_set_aside(d):
    d.mkdir()
    (d / "snapshot-00000000000000000000.json").write_text("{")
    meta = MetadataLog(d)
    try:
        assert meta.latest_snapshot() is None
    finally:
        meta.close()


def w_cluster_credential(d):
    cluster_credential.load_or_create(cluster_credential.path_in(d))


WRITERS = {f.__name__[2:]: f for f in (
    w_segment_index, w_log_start_offset, w_txn_index, w_txn_index_set_aside, w_cleaner_checkpoint,
    w_cleaner_swap, w_producer_snapshot, w_producer_snapshot_set_aside, w_topic_registry, w_topic_deletion,
    w_group_offsets, w_group_records_compaction, w_metadata_snapshot, w_metadata_snapshot_set_aside,
    w_cluster_credential)}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writer_leaves_nothing_a_power_cut_takes_back(writer, tmp_path, trace):
    WRITERS[writer](tmp_path / "data")
    assert trace.renames(), f"{writer} renamed nothing: the case no longer exercises it"
    assert trace.problems() == []


def test_a_writer_without_the_helper_fails_the_check(tmp_path, trace):
    path = tmp_path / "registry.json"
    tmp = tmp_path / "registry.json.tmp"
    with open(tmp, "w") as f:       # what log_manager, cleaner and Segment.write_index used to do
        f.write("[]")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    assert trace.problems() == [f"rename {tmp} -> {path}: its directory is never fsynced after it"]


def test_an_unsynced_replace_fails_the_check(tmp_path, trace):
    durable.replace_file(tmp_path / "x", b"1", durable=False)
    assert len(trace.problems()) == 2


# ------------------------------------------------------------------ the error policy

def test_any_failed_step_raises_a_typed_error_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"old")
    real_fsync = os.fsync

    def eio(fd):
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(durable.DurableWriteError) as raised:
        durable.replace_file(path, b"new")
    assert raised.value.errno == errno.EIO and isinstance(raised.value, OSError)
    assert path.read_bytes() == b"old" and not durable.tmp_path(path).exists()

    def dir_eio(fd):  # only the directory's fsync fails: the rename happened, the write still failed
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EIO, "injected")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", dir_eio)
    with pytest.raises(durable.DurableWriteError, match="directory"):
        durable.replace_file(path, b"new")
    # the producer-state snapshot used to swallow exactly this
    with pytest.raises(durable.DurableWriteError):
        snaps.write_snapshot(tmp_path, 0, _columns())


def test_create_exclusive_never_replaces(tmp_path):
    path = tmp_path / "c"
    durable.create_exclusive(path, "first")
    with pytest.raises(FileExistsError):
        durable.create_exclusive(path, "second")
    assert path.read_text() == "first" and os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def _columns():
    from oncelog.core.producer_state import ProducerStateConfig, ProducerStateManager
    cols = ProducerStateManager(ProducerStateConfig(), hash_key=1).columns()
    return cols._replace(txn_pid=array("q"), txn_first=array("q"))


def test_registry_is_the_helpers_json(tmp_path):
    """The registry reads back as it did before the helper (json, one entry per topic)."""
    _with_topic(tmp_path, overrides={"retention.ms": "5"})
    entries = json.loads((tmp_path / "__oncelog_topics.json").read_text())
    assert [(e["name"], e["partitions"], e["overrides"]) for e in entries] == [("orders", 2, {"retention.ms": "5"})]
