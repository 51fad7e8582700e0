"""tests/sockets.py: a websocket test's coroutine ends even when a task of the app
loses a cancellation (as a cancelled Redis BZPOPMIN does in redis-py)."""

from __future__ import annotations

import asyncio
import threading

from tests.sockets import run_socket_test


async def _stubborn(lost: list[int]) -> None:
    """Loses the first cancellation, as the channel layer's receive sometimes does."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        lost.append(1)
    await asyncio.sleep(3600)


def test_a_task_that_loses_a_cancellation_is_stopped() -> None:
    lost: list[int] = []
    left: list[asyncio.Task] = []

    async def body() -> int:
        left.append(asyncio.ensure_future(_stubborn(lost)))
        await asyncio.sleep(0)
        return 42

    # async_to_sync(body)() never returned here: asyncio.run waited for the task.
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(run_socket_test(body)), daemon=True)
    runner.start()
    runner.join(timeout=20)
    assert not runner.is_alive(), "the run hung"
    assert result == [42] and lost == [1] and left[0].cancelled()
