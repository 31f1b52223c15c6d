"""The broker's client of the controller, against a real in-process controller."""
from __future__ import annotations

import asyncio
import random

import pytest

from oncelog.broker.cluster.controller_client import ControllerClient, ControllerUnavailable
from oncelog.controller.embedded import start_in_process
from oncelog.protocol.api import ApiKey


async def test_a_cancelled_request_is_cancelled_even_when_its_answer_just_arrived(tmp_path):
    """Python 3.11's asyncio.wait_for drops a cancellation that lands just after the answer came
    (it returns the answer instead): a stopping broker's heartbeat loop then never ended. Cancel
    requests at every point of their exchange with an in-process controller; each one that was
    not done when cancelled must end cancelled, and the next request still gets its own answer."""
    controller, reach = await start_in_process(tmp_path)
    host, port = reach["controller.quorum.bootstrap.servers"].rsplit(":", 1)
    client = ControllerClient(host, int(port), reach["controller.sasl.plain.username"],
                              reach["controller.sasl.plain.password"])
    rnd = random.Random(7)
    try:
        await client.request(ApiKey.API_VERSIONS, 0)
        swallowed = cancelled = 0
        for _ in range(300):
            task = asyncio.ensure_future(client.request(ApiKey.API_VERSIONS, 0))
            for _ in range(rnd.randint(0, 12)):
                await asyncio.sleep(0)
            if task.done():
                continue
            task.cancel()
            await asyncio.wait([task], timeout=10)
            assert task.done()
            if task.cancelled():
                cancelled += 1
            else:
                swallowed += 1
        assert swallowed == 0 and cancelled > 0, (swallowed, cancelled)
        r = await client.request(ApiKey.API_VERSIONS, 0)
        assert int(r.error_code) == 0
    finally:
        client.close()
        await controller.stop()


async def test_a_controller_that_never_answers_is_unavailable_after_the_timeout():
    """The deadline aborts the connection (no wait_for, no asyncio.timeout: see _exchange)."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = ControllerClient("127.0.0.1", port, "u", "p", timeout_s=0.2)
    try:
        with pytest.raises(ControllerUnavailable, match="no answer within 0.2 s"):
            await client.request(ApiKey.API_VERSIONS, 0)
    finally:
        client.close()
        server.close()


def test_a_connection_closed_between_requests_is_made_again_under_uvloop(tmp_path):
    """The controller's end of the connection went away between two requests (its kill -9 in a
    verify run): uvloop, which brokers run on, refuses a write to the closed transport with a
    RuntimeError that escaped the client's error handling, so every later request failed the
    same way and the broker followed no view until it was restarted (every partition it was
    handed stayed without a serving leader)."""
    import uvloop

    async def scenario() -> None:
        controller, reach = await start_in_process(tmp_path)
        host, port = reach["controller.quorum.bootstrap.servers"].rsplit(":", 1)
        client = ControllerClient(host, int(port), reach["controller.sasl.plain.username"],
                                  reach["controller.sasl.plain.password"])
        try:
            await client.request(ApiKey.API_VERSIONS, 0)
            assert client._writer is not None
            client._writer.transport.close()   # gone between two requests
            await asyncio.sleep(0)
            r = await client.request(ApiKey.API_VERSIONS, 0)
            assert int(r.error_code) == 0
        finally:
            client.close()
            await controller.stop()
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
