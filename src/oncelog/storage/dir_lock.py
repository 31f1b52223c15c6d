"""One owner per data directory, as Kafka's `.lock` in each log directory: a process that would
write a directory takes its lock first, and a second process refuses to start instead of writing
over the first one's records.

`flock` locks belong to the open file, so the kernel drops them when the owner dies (kill -9
included): a stale lock never needs cleaning up. Who may share a directory:

- a single-node broker (`serve`): `.lock`, exclusive: nobody else;
- the brokers of a cluster on one machine share their directory by design (partitions move by
  handing over their directories, each guarded by its own `.leader.lock`): `.lock` shared, and
  `.lock.node-<id>` exclusive, so two brokers with one node id never run on it;
- `serve --brokers N`: `.lock` shared and `.lock.cluster` exclusive, so a second such command
  refuses before it starts anything;
- a controller: `.lock` in its metadata directory, exclusive.
"""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = ".lock"


class DirectoryLocked(Exception):
    """The directory is in use by another process; the message names it and the holder."""


class DirectoryLock:
    """Locks held on one directory until `release()`."""

    def __init__(self, directory: str | Path, fds: list[int]) -> None:
        self.directory = Path(directory)
        self._fds = fds

    @classmethod
    def exclusive(cls, directory: str | Path, purpose: str) -> DirectoryLock:
        return cls._take(directory, [(LOCK_FILE, True)], purpose)

    @classmethod
    def cluster_member(cls, directory: str | Path, member: str, purpose: str) -> DirectoryLock:
        """`.lock` shared with the cluster's other processes, `.lock.<member>` for this one alone."""
        return cls._take(directory, [(LOCK_FILE, False), (f"{LOCK_FILE}.{member}", True)], purpose)

    @classmethod
    def _take(cls, directory: str | Path, files: list[tuple[str, bool]], purpose: str) -> DirectoryLock:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        fds: list[int] = []
        try:
            for name, exclusive in files:
                fds.append(_lock(directory / name, exclusive, purpose))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return cls(directory, fds)

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # closing the file drops its flock


def _lock(path: Path, exclusive: bool, purpose: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        raise DirectoryLocked(f"{path.parent} is in use by {_holders(path)}: not starting {purpose} "
                              f"on it (lock file {path.name})") from None
    if exclusive:
        # for people and for `_holders` on systems without /proc/locks
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holders(path: Path) -> str:
    """The processes holding a lock on `path` (from /proc/locks), with their command lines."""
    pids: list[int] = []
    try:
        st = os.stat(path)
        file_id = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (blocked waiters have "->")
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4].isdigit() and fields[5] == file_id:
                    pids.append(int(fields[4]))
    except OSError:
        pass
    if not pids:
        try:
            pids = [int(path.read_text().split()[0])]
        except (OSError, ValueError, IndexError):
            return "another process"
    return ", ".join(f"process {pid} ({_command(pid)})" for pid in sorted(set(pids)))


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return "command line unknown"
    return " ".join(" ".join(a.decode(errors="replace").split()) for a in args if a)[:200]
