"""A delaying TCP relay: every byte is held `delay_s` before it goes on, in each direction.

So a round trip through it grows by 2 x delay_s, and it keeps the order of the bytes and
TCP's flow control (a reader is paused while its writer is backed up). Listens on a
loopback or namespace address only; forwards to one upstream.

    python -m robotserve_ros.net.relay --listen 127.0.0.1:0 --to 10.1.2.2:50051 --delay-s 0.05 [--ready-file F]
"""
from __future__ import annotations

import argparse
import asyncio
import threading
import time
from pathlib import Path
from typing import Optional


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue(maxsize=256)

    async def read() -> None:
        while True:
            data = await reader.read(65536)
            await q.put((loop.time() + delay_s, data))
            if not data:
                return

    async def write() -> None:
        while True:
            due, data = await q.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass

    r = asyncio.ensure_future(read())
    try:
        await write()
    except (ConnectionError, OSError):
        pass
    finally:
        r.cancel()


class DelayRelay:
    """Runs in a thread of its own event loop; `port` is the bound listening port."""

    def __init__(self, listen: str, upstream: str, delay_s: float) -> None:
        self.host, port = listen.rsplit(":", 1)
        self.up_host, up_port = upstream.rsplit(":", 1)
        self.port, self.up_port, self.delay_s = int(port), int(up_port), float(delay_s)
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: Optional[asyncio.AbstractServer] = None
        self._thread = threading.Thread(target=self._run, name="delay-relay", daemon=True)
        self._thread.start()
        if not self._ready.wait(5.0) or self._server is None:
            raise OSError(f"relay could not listen on {listen}")

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            ur, uw = await asyncio.open_connection(self.up_host, self.up_port)
        except OSError:
            cw.close()
            return
        try:
            await asyncio.gather(_pump(cr, uw, self.delay_s), _pump(ur, cw, self.delay_s), return_exceptions=True)
        except asyncio.CancelledError:  # close(): the relay goes away, quietly
            pass
        finally:
            for w in (cw, uw):
                w.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
            self.port = self._server.sockets[0].getsockname()[1]

        try:
            self._loop.run_until_complete(start())
        finally:
            self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            # Let the cancelled connections unwind before the loop stops (else asyncio warns
            # "Task was destroyed but it is pending").
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=2.0)
        except Exception:  # a stuck connection must not keep the relay open
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=2.0)

    def __enter__(self) -> "DelayRelay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m robotserve_ros.net.relay", description=__doc__)
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--to", required=True)
    p.add_argument("--delay-s", type=float, required=True, help="one-way delay, each direction")
    p.add_argument("--ready-file")
    a = p.parse_args(argv)
    relay = DelayRelay(a.listen, a.to, a.delay_s)
    if a.ready_file:
        Path(a.ready_file).write_text(relay.address + "\n")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        relay.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
