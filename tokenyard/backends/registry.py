"""The backends the gateway can serve, by model name; polls their readiness and load."""

import asyncio

from tokenyard.backends.base import Upstream
from tokenyard.core.tasks import cancel_and_wait


class Backends:
    """The models the gateway can serve, each behind one Upstream; polls their readiness."""

    def __init__(self, upstreams: dict[str, Upstream], poll_s: float = 1.0) -> None:
        self.upstreams = upstreams
        self.poll_s = poll_s
        self._task: asyncio.Task[None] | None = None

    def get(self, model: str) -> Upstream | None:
        return self.upstreams.get(model)

    async def refresh(self) -> None:
        await asyncio.gather(*(u.refresh() for u in self.upstreams.values()))

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.refresh()

    async def aclose(self) -> None:
        await cancel_and_wait(self._task)
        await asyncio.gather(*(u.aclose() for u in self.upstreams.values()))
