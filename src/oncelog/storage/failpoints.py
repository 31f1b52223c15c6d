"""Storage failpoints: faults injected into the writes, fsyncs and cuts of partition segments, of
the controller's metadata log, of share groups' state logs and of the groups' record logs
(committed offsets, consumer groups, pending transactional offsets), for tests and `oncelog
verify`.

Off unless the environment variable ONCELOG_FAILPOINTS is set when this module is imported (a
broker or controller process reads it once at start), or a test calls `configure()`. When off,
the hooks below *are* the os functions (`log_write is os.pwrite`), so storage pays nothing for
them: it calls `failpoints.log_write(...)` where it would call `os.pwrite(...)`.

ONCELOG_FAILPOINTS holds rules separated by commas, each `fault:target[:option=value...]`:

    faults   fsync-eio     the fsync raises EIO (the bytes were written, not synced)
             shortwrite    the write puts the first half of the bytes in the file and returns
                           that count, as a write that meets a full disk does
             enospc        the write raises ENOSPC and writes nothing
             truncate-eio  the ftruncate that cuts a failed write back raises EIO
             crash         SIGKILL this process right after a write (its bytes are in the page
                           cache, not synced), with `at=fsync` right before an fsync, with
                           `at=synced` right after an fsync returned (before anyone is told),
                           or with `at=rename` right before a rename (the cleaner's segment swap,
                           a group record log's compaction)
             ledger        after every successful fsync, append "<file> <size>" to `.fsynced`
                           in the file's directory: what a power loss would leave (see
                           oncelog.testing.power_loss)
    targets  log (partition segments), metadata (the controller's metadata log), share (share
             groups' state logs, `storage.share_state`; writes and fsyncs only), groups (the
             groups' record logs, `storage.group_records`: appends, their fsyncs, cuts and
             compactions' renames), any
    options  after=N   let the first N matching calls through (default 0)
             times=N   fire N times, then never again (default 1; 0 = every matching call)
             match=S   only files whose path contains S (e.g. a topic-partition "orders-0")
             at=write|fsync|synced|rename   (crash only) where to die; default write

    ONCELOG_FAILPOINTS="fsync-eio:log:after=3:times=2"
    ONCELOG_FAILPOINTS="shortwrite:metadata:after=1,ledger:any"
    ONCELOG_FAILPOINTS="crash:log:match=orders-0:after=100,ledger:any"
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from oncelog.protocol.primitives import Buf

log = logging.getLogger(__name__)

ENV = "ONCELOG_FAILPOINTS"
LEDGER = ".fsynced"
FAULTS = ("fsync-eio", "shortwrite", "enospc", "truncate-eio", "crash", "ledger")
TARGETS = ("log", "metadata", "share", "groups", "any")

# The hooks storage calls. Off: the os functions themselves.
log_write: Callable[..., int] = os.pwrite          # (fd, data, offset) -> bytes written
log_sync: Callable[[int], None] = os.fsync            # (fd)
log_truncate: Callable[[int, int], None] = os.ftruncate    # (fd, size)
log_rename: Callable[..., None] = os.replace      # (src, dst): the cleaner's swap, via storage.durable.rename
meta_write: Callable[..., int] = os.write          # (fd, data) -> bytes written
meta_sync: Callable[[int], None] = os.fsync
meta_truncate: Callable[[int, int], None] = os.ftruncate
share_write: Callable[..., int] = os.pwrite        # (fd, data, offset) -> bytes written
share_sync: Callable[[int], None] = os.fsync
group_write: Callable[..., int] = os.pwrite        # (fd, data, offset) -> bytes written
group_sync: Callable[[int], None] = os.fsync
group_truncate: Callable[[int, int], None] = os.ftruncate
group_rename: Callable[..., None] = os.replace    # (src, dst): a compaction's new file put in place


class FailpointSyntaxError(ValueError):
    pass


@dataclass
class Rule:
    fault: str
    target: str
    after: int = 0
    times: int = 1
    match: str = ""
    at: str = "write"
    seen: int = 0
    fired: int = 0

    def applies(self, target: str, path: str) -> bool:
        return self.target in ("any", target) and (not self.match or self.match in path)

    def due(self) -> bool:
        """After counting a matching call: should it fail?"""
        return self.seen > self.after and not (self.times and self.fired >= self.times)


def parse(spec: str) -> list[Rule]:
    rules = []
    for text in filter(None, (t.strip() for t in spec.split(","))):
        fault, _, rest = text.partition(":")
        parts = rest.split(":") if rest else []
        target = parts.pop(0) if parts and "=" not in parts[0] else "any"
        if fault not in FAULTS:
            raise FailpointSyntaxError(f"{text!r}: unknown fault {fault!r} (one of {', '.join(FAULTS)})")
        if target not in TARGETS:
            raise FailpointSyntaxError(f"{text!r}: unknown target {target!r} (one of {', '.join(TARGETS)})")
        rule = Rule(fault, target)
        for option in parts:
            name, eq, value = option.partition("=")
            if not eq or name not in ("after", "times", "match", "at"):
                raise FailpointSyntaxError(f"{text!r}: bad option {option!r} (after=, times=, match=, at=)")
            if name in ("after", "times"):
                if not value.isdigit():
                    raise FailpointSyntaxError(f"{text!r}: {name} needs a count, not {value!r}")
                setattr(rule, name, int(value))
            elif name == "at" and value not in ("write", "fsync", "synced", "rename"):
                raise FailpointSyntaxError(f"{text!r}: at=write, fsync, synced or rename, not {value!r}")
            else:
                setattr(rule, name, value)
        rules.append(rule)
    return rules


_rules: list[Rule] = []
_lock = threading.Lock()  # fsyncs run in the broker's fsync threads


def rules() -> list[Rule]:
    """The active rules (with their counts), for tests and logs."""
    return list(_rules)


def configure(spec: str | None) -> list[Rule]:
    """Install the rules of `spec` (None or "" turns every failpoint off): the test hook."""
    global _rules, log_write, log_sync, log_truncate, log_rename, meta_write, meta_sync, meta_truncate
    global share_write, share_sync, group_write, group_sync, group_truncate, group_rename
    _rules = parse(spec or "")
    if not _rules:
        log_write, log_sync, log_truncate, log_rename = os.pwrite, os.fsync, os.ftruncate, os.replace
        meta_write, meta_sync, meta_truncate = os.write, os.fsync, os.ftruncate
        share_write, share_sync = os.pwrite, os.fsync
        group_write, group_sync, group_truncate, group_rename = os.pwrite, os.fsync, os.ftruncate, os.replace
        return []
    group_write, group_sync = _writer("groups", os.pwrite), _syncer("groups")
    group_truncate, group_rename = _truncater("groups"), _renamer("groups")
    log_write = _writer("log", os.pwrite)
    meta_write = _writer("metadata", os.write)
    share_write = _writer("share", os.pwrite)
    log_sync, meta_sync, share_sync = _syncer("log"), _syncer("metadata"), _syncer("share")
    log_truncate, meta_truncate = _truncater("log"), _truncater("metadata")
    log_rename = _renamer("log")
    log.warning("storage failpoints active: %s", spec)
    return list(_rules)


def _path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _at_write(rule: Rule) -> bool:
    return rule.fault in ("shortwrite", "enospc") or (rule.fault == "crash" and rule.at == "write")


def _at_fsync(rule: Rule) -> bool:
    return rule.fault == "fsync-eio" or (rule.fault == "crash" and rule.at == "fsync")


def _after_fsync(rule: Rule) -> bool:
    return rule.fault == "crash" and rule.at == "synced"


def _at_truncate(rule: Rule) -> bool:
    return rule.fault == "truncate-eio"


def _firing(target: str, path: str, kind: Callable[[Rule], bool]) -> Rule | None:
    """Every rule of this kind counts the call; the first that fires decides it."""
    chosen = None
    with _lock:
        for rule in _rules:
            if kind(rule) and rule.applies(target, path):
                rule.seen += 1
                if chosen is None and rule.due():
                    rule.fired += 1
                    chosen = rule
    if chosen is not None:
        log.warning("failpoint %s:%s fires on %s (call %d)", chosen.fault, chosen.target, path, chosen.seen)
    return chosen


def _crash(path: str) -> None:
    log.critical("failpoint crash at %s: SIGKILL", path)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


def _writer(target: str, real: Callable[..., int]) -> Callable[..., int]:
    def write(fd: int, data: Buf, *position: int) -> int:
        path = _path(fd)
        rule = _firing(target, path, _at_write)
        if rule is None:
            return real(fd, data, *position)
        if rule.fault == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if rule.fault == "shortwrite":
            return real(fd, memoryview(data)[:len(data) // 2], *position)
        real(fd, data, *position)
        _crash(path)
        return 0  # not reached: the process is gone
    return write


def _syncer(target: str) -> Callable[[int], None]:
    def sync(fd: int) -> None:
        path = _path(fd)
        rule = _firing(target, path, _at_fsync)
        if rule is not None:
            if rule.fault == "crash":
                _crash(path)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        size = os.fstat(fd).st_size  # what this fsync covers at least
        os.fsync(fd)
        if any(r.fault == "ledger" and r.applies(target, path) for r in _rules):
            record_fsynced(path, size)
        if _firing(target, path, _after_fsync) is not None:
            _crash(path)   # durable, and nobody told
    return sync


def _at_rename(rule: Rule) -> bool:
    return rule.fault == "crash" and rule.at == "rename"


def _renamer(target: str) -> Callable[..., None]:
    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if _firing(target, os.fspath(src), _at_rename) is not None:
            _crash(os.fspath(src))
        os.replace(src, dst)
        if any(r.fault == "ledger" and r.applies(target, os.fspath(dst)) for r in _rules):
            # what was fsynced under the old name is now the new name's (a power loss keeps it)
            synced = read_ledger(os.path.dirname(os.fspath(src))).get(os.path.basename(os.fspath(src)))
            if synced is not None:
                record_fsynced(os.fspath(dst), synced)
    return rename


def _truncater(target: str) -> Callable[[int, int], None]:
    def truncate(fd: int, size: int) -> None:
        if _firing(target, _path(fd), _at_truncate) is not None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.ftruncate(fd, size)
    return truncate


def replaced(target: str, path: str, size: int) -> None:
    """`path` was just replaced whole and durably (`storage.durable.replace_file`, which fsyncs
    without these hooks): the ledger learns its size, so a power loss keeps it."""
    if any(r.fault == "ledger" and r.applies(target, path) for r in _rules):
        record_fsynced(path, size)


def record_fsynced(path: str, size: int) -> None:
    """One ledger line; a single O_APPEND write, so concurrent writers do not interleave."""
    directory, name = os.path.split(path)
    fd = os.open(os.path.join(directory, LEDGER), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{name} {size}\n".encode())
    finally:
        os.close(fd)


def read_ledger(directory: str | os.PathLike[str]) -> dict[str, int]:
    """{file name: size at its last fsync} from a directory's ledger ({} without one)."""
    out: dict[str, int] = {}
    try:
        text = open(os.path.join(directory, LEDGER)).read()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        name, _, size = line.rpartition(" ")
        if name and size.isdigit():
            out[name] = int(size)
    return out


if os.environ.get(ENV):
    configure(os.environ[ENV])
