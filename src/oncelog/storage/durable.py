"""Making a directory entry durable: after a file is created, renamed over another or removed,
the directory itself is fsynced, or a power cut may bring back what was there before."""
from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: str | Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
