"""Producer ids without a controller: blocks reserved in a file, so a restart never reuses an id.

Same interface as the KIP-730 block manager (`generate_producer_id`), which replaces it when a
controller runs. The reservation is written and fsynced before any id of the block is handed out.
"""
from __future__ import annotations

import os
from pathlib import Path

BLOCK_SIZE = 1000


class LocalProducerIds:
    def __init__(self, directory: str | Path, block_size: int = BLOCK_SIZE) -> None:
        self._path = Path(directory) / "producer-id-block"
        self._block_size = block_size
        self._next = self._limit = self._read_reserved()

    def _read_reserved(self) -> int:
        try:
            return int(self._path.read_text().strip())
        except FileNotFoundError:
            return 0

    def _reserve(self, limit: int) -> None:
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(f"{limit}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        dir_fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._limit = limit

    async def generate_producer_id(self) -> int:
        if self._next >= self._limit:
            self._reserve(self._next + self._block_size)
        pid = self._next
        self._next += 1
        return pid

    @property
    def highest_reserved(self) -> int:
        return self._limit
