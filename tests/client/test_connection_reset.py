"""A broker connection reset while it opens (the proxy's reset fault) is a connection error the
producer and consumer retry, not a RuntimeError from uvloop's closed transport."""
import asyncio
import socket
import struct
import threading
import time

import pytest

from oncelog.client.aio.connection import BrokerConnectionError, Connection

uvloop = pytest.importorskip("uvloop")


def resetting_listener() -> tuple[socket.socket, threading.Thread]:
    """Accepts one connection and resets it (RST: SO_LINGER 0, then close)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run() -> None:
        conn, _ = srv.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv, t


def test_reset_during_connect_is_a_connection_error():
    srv, t = resetting_listener()
    port = srv.getsockname()[1]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        opened = loop.create_connection

        async def reset_first(*args, **kwargs):
            # the reset is handled before the caller resumes, as it is when it arrives with the handshake
            transport, proto = await opened(*args, **kwargs)
            deadline = time.monotonic() + 5
            while not transport.is_closing() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert transport.is_closing()
            return transport, proto
        loop.create_connection = reset_first  # type: ignore[method-assign]
        with pytest.raises(BrokerConnectionError):
            await Connection("127.0.0.1", port, "test").connect(5)

    try:
        uvloop.run(main())
    finally:
        t.join(5)
        srv.close()
