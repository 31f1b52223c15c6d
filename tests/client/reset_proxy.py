"""A TCP proxy for tests that cuts every connection after a number of client bytes, so that
requests in flight are lost (processed or not) and the client must reconnect and retry."""
from __future__ import annotations

import asyncio
import random
import threading


class ResetProxy:
    def __init__(self, target: tuple[str, int], cut_after_bytes: tuple[int, int], seed: int = 1) -> None:
        self.target = target
        self.cut = cut_after_bytes
        self.rng = random.Random(seed)
        self.resets = 0
        self.enabled = True
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        fut = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._client, "127.0.0.1", 0), self.loop)
        self.server = fut.result(5)
        self.port = self.server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"

    async def _client(self, cr, cw) -> None:
        try:
            br, bw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        budget = [self.rng.randint(*self.cut)]

        async def pipe(r, w, count):
            try:
                while True:
                    d = await r.read(65536)
                    if not d:
                        break
                    if count and self.enabled:
                        budget[0] -= len(d)
                        if budget[0] <= 0:
                            # forward part of it, then cut both sides
                            w.write(d[:len(d) // 2])
                            self.resets += 1
                            break
                    w.write(d)
            except (ConnectionError, OSError):
                pass
            finally:
                for x in (cw, bw):
                    x.transport.abort()
        await asyncio.gather(pipe(cr, bw, True), pipe(br, cw, False))

    def close(self) -> None:
        async def shutdown():
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
