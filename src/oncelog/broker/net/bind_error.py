"""A listener or the metrics endpoint that cannot bind its address: the one line an operator
needs (which address, why, which setting moves it) instead of the socket's traceback."""
from __future__ import annotations

import errno

_WHY = {errno.EADDRINUSE: "the address is in use (another broker, or another program, listens there)",
        errno.EACCES: "permission denied (ports below 1024 need privileges)",
        errno.EADDRNOTAVAIL: "no interface of this machine has that address"}


def is_bind_failure(e: OSError) -> bool:
    """Whether an OSError from starting a server is about its address (not, say, a full disk
    met while the server opened its files)."""
    return e.errno in _WHY


class BindError(Exception):
    def __init__(self, what: str, host: str | None, port: int, cause: OSError, setting: str) -> None:
        self.cause = cause
        why = _WHY.get(cause.errno or 0, cause.strerror or str(cause))
        super().__init__(f"cannot bind {what} to {host or '0.0.0.0'}:{port}: {why}; choose another port with "
                         f"{setting}")
