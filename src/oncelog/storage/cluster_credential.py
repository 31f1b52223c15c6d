"""The cluster credential: the user and password brokers authenticate with to the controller and
to each other (the cluster principal), generated once per data directory and kept in a file only
its owner can read (`cluster.credential`, mode 0600, JSON `{"username", "password"}`).

It never travels on a command line: `oncelog serve`, `oncelog controller` and `oncelog admin`
read it from the file. A file that others may read is refused (as ssh refuses a private key
others can read): whoever reads it can act as a broker.
"""
from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from oncelog.storage.durable import create_exclusive

FILE_NAME = "cluster.credential"
DEFAULT_USER = "oncelog-broker"


class CredentialFileError(Exception):
    """The file is missing, unreadable, malformed or readable by others."""


@dataclass(frozen=True)
class ClusterCredential:
    username: str
    password: str

    def __repr__(self) -> str:  # the password stays out of logs and tracebacks
        return f"ClusterCredential(username={self.username!r})"


def path_in(directory: str | Path) -> Path:
    return Path(directory) / FILE_NAME


def read_private(path: str | Path) -> str:
    """The text of a file only its owner may read (CredentialFileError otherwise): for secrets
    handed to a process by file rather than on its command line."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CredentialFileError(f"{path} does not exist") from None
    except OSError as e:
        raise CredentialFileError(f"{path}: {e.strerror}") from None
    with os.fdopen(fd) as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise CredentialFileError(f"{path} is readable by others (mode {stat.S_IMODE(mode):04o}): "
                                      f"`chmod 600 {path}`, and change what it holds if others read it")
        return f.read()


def load(path: str | Path) -> ClusterCredential:
    try:
        data = json.loads(read_private(path))
        return ClusterCredential(str(data["username"]), str(data["password"]))
    except (ValueError, KeyError, TypeError) as e:
        raise CredentialFileError(f"{path} is not a cluster credential ({e})") from None


def create(path: str | Path, credential: ClusterCredential) -> None:
    """Write `credential` to a new file at `path` (0600, fsynced); FileExistsError if there is one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # never replaces a file: two processes racing agree on the first one
    create_exclusive(path, json.dumps({"username": credential.username, "password": credential.password}),
                     mode=0o600)


def load_or_create(path: str | Path) -> ClusterCredential:
    """The credential in `path`, made with a random password if there is none yet."""
    try:
        create(path, ClusterCredential(DEFAULT_USER, secrets.token_urlsafe(24)))
    except FileExistsError:
        pass
    return load(path)
