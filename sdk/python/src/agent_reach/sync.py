"""A small synchronous facade over :class:`~agent_reach.Client`, for scripts and notebooks.

    from agent_reach import SyncClient

    with SyncClient.local() as mesh:
        print(mesh.invoke("text.summarize", text="...").text())
        for chunk in mesh.invoke_stream("text.generate", text="a poem"):
            print(chunk.text())

It runs its own event loop in a background thread, so it also works where a loop is
already running (a Jupyter notebook).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from agent_reach.client import Chunk, Client, Response, Route

T = TypeVar("T")


class SyncClient:
    """Blocking calls through the local sidecar; same arguments as :class:`Client`."""

    def __init__(self, address: str | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent-reach-sync", daemon=True)
        self._thread.start()
        self._client: Client = self._run(self._make(address))

    @staticmethod
    async def _make(address: str | None) -> Client:
        return Client(address)

    @classmethod
    def local(cls) -> SyncClient:
        """A client of the local sidecar (``AGENT_REACH_SIDECAR`` or 127.0.0.1:7700)."""
        return cls()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def invoke(self, capability: str | None = None, **kwargs: Any) -> Response:
        """See :meth:`Client.invoke`."""
        return self._run(self._client.invoke(capability, **kwargs))

    def invoke_stream(self, capability: str | None = None, **kwargs: Any) -> Iterator[Chunk]:
        """See :meth:`Client.invoke_stream`; chunks are read as the loop asks for them."""
        stream = self._run(self._open_stream(capability, kwargs))
        iterator = stream.__aiter__()
        try:
            while True:
                try:
                    yield self._run(_anext(iterator))
                except StopAsyncIteration:
                    return
        finally:
            stream.cancel()

    async def _open_stream(self, capability: str | None, kwargs: dict[str, Any]) -> Any:
        return self._client.invoke_stream(capability, **kwargs)

    def route(self, capability: str | None = None, **kwargs: Any) -> Route:
        """See :meth:`Client.route`."""
        return self._run(self._client.route(capability, **kwargs))

    def close(self) -> None:
        """Closes the connection and stops the background loop."""
        if self._loop.is_closed():
            return
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def _anext(iterator: Any) -> Chunk:
    item: Chunk = await iterator.__anext__()
    return item
