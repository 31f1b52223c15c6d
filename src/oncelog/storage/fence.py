"""Fencing tokens: one owner at a time for what the brokers of one machine share (issue 34).

The brokers of a cluster are processes sharing one data directory. What each owns — a partition's
log, a `__transaction_state` partition, the groups of a `__consumer_offsets` partition — is
granted by the controller with a leader epoch, and a broker's belief that it still owns something
can be stale for as long as the broker was paused (SIGSTOP, a stalled VM). So storage, not the
broker's memory, decides: each owned thing has a *token*, an epoch in a small file beside its
data, which a new owner raises to its leader epoch before it reads anything, and every write of an
owner happens while holding the token's lock, after checking that the token still holds the
owner's epoch. A write of a deposed owner is refused (`Fenced`) before a byte reaches the file; a
write that completed before the raise is in the files the new owner then reads. The new owner
never waits for the old one (except in the narrow case below).

What is atomic on one machine: an exclusive `flock` (per open file, released by the kernel when
the process dies) makes "check the token, write" and "raise the token" mutually exclusive. It is
held for the check and the write only; `fsync` needs no lock (it changes no bytes). The token is
eight bytes read through a shared `mmap` of the file, so the check an owner makes before
answering from memory (`Lease.valid`) is a memory load. The token is never fsynced: a power cut
stops every process, and each restarts at the controller's durable epochs, which are never below
a token anyone raised.

The lock is taken without blocking: a process paused while holding it (inside one write) must not
stall the event loop of the process that wants it. `Busy` (retriable) is raised after a short spin
instead; a new owner then retries its raise at its next look, and the paused process completes its
write when it resumes (it was legitimate: the token had not moved yet).
"""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TOKEN_FILE = ".leader.epoch"   # in a partition's directory
_EPOCH = struct.Struct(">q")
_SPIN_S = 0.005                 # longer than any other process's check-and-write, far shorter than a pause
_SPIN_STEP_S = 0.0002


class Fenced(OSError):
    """A newer owner raised the token: this owner may write nothing more (errno ESTALE, so callers
    that answer a storage error answer this one too)."""

    def __init__(self, what: str, epoch: int, current: int) -> None:
        super().__init__(errno.ESTALE, f"{what}: fenced at epoch {epoch}, the owner is now at epoch {current}")
        self.what, self.epoch, self.current = what, epoch, current


class Busy(OSError):
    """The token's lock is held by another process right now (retriable)."""

    def __init__(self, what: str) -> None:
        super().__init__(errno.EAGAIN, f"{what}: the ownership token is locked by another process")


class Token:
    """The epoch file of one owned thing: its shared eight bytes and its lock."""

    def __init__(self, path: str | Path, what: str = "") -> None:
        self.path = Path(path)
        self.what = what or str(self.path.parent.name)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._depth = 0
        self._closed_at = -1
        try:
            if os.fstat(self.fd).st_size < _EPOCH.size:
                with self.locked():
                    if os.fstat(self.fd).st_size < _EPOCH.size:
                        os.ftruncate(self.fd, _EPOCH.size)   # a new token: epoch 0, which any owner may take
            self._map = mmap.mmap(self.fd, _EPOCH.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise

    def current(self) -> int:
        """The epoch of the latest owner to raise it (no lock: an owner's check before it answers
        from memory; `Lease.writing` checks under the lock). A closed token answers what it held
        when it was closed: a request that waited while its partition was dropped is refused as
        fenced, not failed on the unmapped file."""
        try:
            return int(_EPOCH.unpack_from(self._map, 0)[0])
        except ValueError:   # the map is closed (no check first: the log cleaner's thread may close it meanwhile)
            return self._closed_at

    def _store(self, epoch: int) -> None:
        _EPOCH.pack_into(self._map, 0, epoch)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The token's lock, re-entrant within this object; `Busy` when another process holds it
        beyond a short spin."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        deadline = time.monotonic() + _SPIN_S
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Busy(self.what) from None
                time.sleep(_SPIN_STEP_S)
        self._depth = 1
        try:
            yield
        finally:
            self._depth = 0
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def raise_to(self, epoch: int) -> None:
        """A new owner at `epoch` (the caller holds `locked()`): `Fenced` if a newer one already
        raised it. An equal epoch is the same owner (the controller grants each epoch once): a
        broker restarted at the epoch it held takes it again."""
        current = self.current()
        if current > epoch:
            raise Fenced(self.what, epoch, current)
        if current != epoch:
            self._store(epoch)

    def check(self, epoch: int) -> None:
        """`Fenced` unless the token holds `epoch` (the caller holds `locked()`)."""
        current = self.current()
        if current != epoch:
            raise Fenced(self.what, epoch, current)

    def close(self) -> None:
        if self.fd < 0:
            return
        self._closed_at = self.current()
        try:
            self._map.close()
        finally:
            os.close(self.fd)
            self.fd = -1


class Lease:
    """One owner's hold on a token at its epoch."""

    def __init__(self, token: Token, epoch: int) -> None:
        self.token, self.epoch = token, epoch
        self.lost = False   # a check found a newer owner: stays lost

    @classmethod
    def take(cls, path: str | Path, epoch: int, what: str = "") -> Lease:
        """Raise the token at `path` to `epoch` and hold it. `Fenced` when a newer owner has it,
        `Busy` when its lock is held (try again later)."""
        token = Token(path, what)
        try:
            with token.locked():
                token.raise_to(epoch)
        except BaseException:
            token.close()
            raise
        return cls(token, epoch)

    def valid(self) -> bool:
        """Still the owner, as a lock-free read tells (what an owner checks before it serves
        anything from memory; the writes' check is under the lock). The token only ever grows
        and is one aligned eight-byte store, so any other value than ours is a newer owner's."""
        if self.lost:
            return False
        if self.token.current() != self.epoch:
            self.lost = True
        return not self.lost

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the lock while writing, after checking the token (re-entrant): `Fenced` when a
        newer owner raised it (and the lease stays lost), `Busy` when another process holds the
        lock."""
        if self.lost:
            raise Fenced(self.token.what, self.epoch, self.token.current())
        with self.token.locked():
            try:
                self.token.check(self.epoch)
            except Fenced:
                self.lost = True
                raise
            yield

    def superseded(self) -> bool:
        """A lock-free look only, safe from any thread (the log cleaner's): a newer owner raised
        the token, or this lease was closed."""
        return self.lost or self.token.fd < 0 or self.token.current() != self.epoch

    def close(self) -> None:
        self.lost = True
        self.token.close()
