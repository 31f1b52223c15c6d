"""Durable file replacement: the one way storage gives a file new contents or a new name that a
power cut cannot take back. Every rename, link and temp-file write in `oncelog` goes through this
module (`tests/storage/test_durable.py` scans the source for any that does not).

`replace_file(path, data)` does the four steps, in this order:
    1. write `data` to `<name>.tmp` beside `path` (same directory, so the rename is atomic),
    2. fsync that file: its bytes are on disk before any name points at them,
    3. rename it over `path`: a crash leaves the old file or the new one, never a mix,
    4. fsync the directory: the rename itself is on disk. Without this step a power cut may bring
       back the old file (or no file) after the caller was told the write was done: the topic
       registry forgets a topic, the log start offset returns deleted records, a snapshot's
       promise ("recovery need not read below S") is made by a file that may vanish.
`rename(src, dst)` is steps 3 and 4 for a file that is already complete (the cleaner's segment
swap, setting a corrupt file aside); `create_exclusive` links instead of renaming, so it never
replaces a file; `fsync_dir` is step 4 alone, after a file is created or removed.
`write_aside` and `install` split `replace_file` for a writer that must not wait for the disk on
its own thread (a record log's compaction, `storage.group_records`): steps 1 and 2 under a name
of the caller's (on a thread), then step 3 alone; the caller owes step 4 and counts nothing of
the new file as durable before its `fsync_dir` returned.

Error policy (one for every writer): any failure of any step raises `DurableWriteError`, an
`OSError` that keeps the errno, and the temp file is removed. Before step 3 the old file is
intact; if only step 4 failed the new contents are in place but not known to be durable, which
the caller must treat as a failed write as well. Raising, not swallowing, because only the caller
knows what a failed write means: a Produce answers KAFKA_STORAGE_ERROR, a producer-state snapshot
may be given up (recovery falls back to an older one or to the log), a controller refuses the
change. The three directory-fsync versions this module replaces had three policies (raise,
swallow, inline), and the one that swallowed turned a failed fsync into a durability promise.
It is an `OSError`, so every caller that already handled a failed write (a full disk, EIO on the
file's fsync) handles this one too.

`durable=False` (`replace_file` only) keeps steps 1 and 3: atomic but not durable, for files a
reader can lose (checksummed producer-state snapshots written on the append path, where two
fsyncs per segment roll would stall the event loop); the error policy is the same.
"""
from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

TMP_SUFFIX = ".tmp"

StrPath = str | os.PathLike[str]


# a file this process creates: never an existing file (O_EXCL), never through a symbolic link
# (O_NOFOLLOW; O_EXCL alone refuses a link too, this says it), so its owner and mode are the ones
# asked for, whoever could write in the directory before
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


class DurableWriteError(OSError):
    """A file or directory entry that could not be made durable; `errno` is the cause's."""


def _failed(step: str, path: StrPath, e: OSError) -> DurableWriteError:
    err = DurableWriteError(e.errno, f"{step} of {os.fspath(path)} failed: {e.strerror or e}")
    err.filename = os.fspath(path)
    return err


def tmp_path(path: StrPath) -> Path:
    """Where `replace_file` writes before the rename: `<name>.tmp` beside `path`."""
    path = Path(path)
    return path.with_name(path.name + TMP_SUFFIX)


def fsync_dir(directory: StrPath) -> None:
    """fsync a directory, so the entries created, renamed or removed in it survive a power cut."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise _failed("fsync of the directory", directory, e) from e


def replace_file(path: StrPath, data: bytes | str, *, mode: int = 0o644, durable: bool = True) -> None:
    """Replace `path` with `data` (str is written as UTF-8): temp file, fsync, rename, fsync of the
    directory. `mode`: the new file's permissions (0o600 for what others must not read)."""
    path = Path(path)
    tmp = tmp_path(path)
    payload = data.encode() if isinstance(data, str) else data
    _discard(tmp)   # a crash's leftover, or something planted there: never written through
    try:
        _write_new(tmp, payload, mode, fsync=durable)
    except OSError as e:
        _discard(tmp)
        raise _failed("write", tmp, e) from e
    try:
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise _failed("rename", path, e) from e
    if durable:
        fsync_dir(path.parent)


def write_aside(path: StrPath, data: bytes, *, suffix: str) -> Path:
    """Steps 1 and 2 of `replace_file` under `<name><suffix>` beside `path` (any thread): the
    new contents, fsynced, under a name nobody reads; `install` puts them in place. The same
    error policy (the temp file removed on failure)."""
    tmp = Path(path).with_name(Path(path).name + suffix)
    _discard(tmp)
    try:
        _write_new(tmp, data, 0o644, fsync=True)
    except OSError as e:
        _discard(tmp)
        raise _failed("write", tmp, e) from e
    return tmp


def install(tmp: StrPath, path: StrPath, *, via: Callable[[StrPath, StrPath], object] | None = None) -> None:
    """Step 3 alone: `tmp` (from `write_aside`) replaces `path`. Not durable until the caller's
    `fsync_dir(path's directory)` returned: until then a power cut may bring back the old file
    (whose durable contents the caller must not have cut). `via`: the failpoint hook."""
    try:
        (via or os.replace)(tmp, path)
    except OSError as e:
        _discard(Path(tmp))
        raise _failed("rename", path, e) from e


def discard(path: StrPath) -> None:
    """Remove a temp file of `write_aside` that will not be installed."""
    _discard(Path(path))


def rename(src: StrPath, dst: StrPath, *, via: Callable[[StrPath, StrPath], object] | None = None) -> None:
    """Rename `src` (complete, and fsynced if its contents matter) to `dst`, replacing it, and
    fsync the directories of both. `via`: the call that renames (the storage failpoints' hook
    `failpoints.log_rename`, where a test may crash the process right before it); os.replace
    by default."""
    try:
        (via or os.replace)(src, dst)
    except OSError as e:
        raise _failed("rename", dst, e) from e
    fsync_dir(Path(dst).parent)
    if Path(src).parent != Path(dst).parent:
        fsync_dir(Path(src).parent)


def create_exclusive(path: StrPath, data: bytes | str, *, mode: int = 0o600) -> None:
    """Create `path` with `data`, durably, unless it exists (FileExistsError, and nothing
    changed): written and fsynced under a name of this process, then linked, so two processes
    racing agree on the first file and no reader ever sees a partial one."""
    path = Path(path)
    # a name nobody can plant beforehand (issue 36: `.<name>.<pid>.tmp` was opened as found, so a
    # file or link put there by another user got the secret); created, never opened as found
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}{TMP_SUFFIX}")
    payload = data.encode() if isinstance(data, str) else data
    try:
        try:
            _write_new(tmp, payload, mode, fsync=True)
        except OSError as e:
            raise _failed("write", tmp, e) from e
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError as e:
            raise _failed("link", path, e) from e
    finally:
        _discard(tmp)
    fsync_dir(path.parent)


def _write_new(path: Path, payload: bytes, mode: int, *, fsync: bool) -> None:
    """Create `path` (never open one found there: O_EXCL, O_NOFOLLOW) with all of `payload`."""
    fd = os.open(path, _NEW_FILE, mode)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _discard(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
