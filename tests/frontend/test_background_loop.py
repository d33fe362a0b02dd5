"""The offline LLM's background event loop: cancel_pending ends every other task, also one that survives its first
cancel (Python 3.11's asyncio.wait_for swallows a cancel that arrives as its inner future completes: an engine
restart's start() did, and LLM.shutdown then waited forever) and one that starts another task as it goes."""
import asyncio
import threading

from tinyvllm.frontend.engine.background_loop import BackgroundLoop


async def stubborn(started: threading.Event, children: list) -> None:
    started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass  # swallowed, as wait_for may
    children.append(asyncio.get_running_loop().create_task(asyncio.sleep(3600)))
    await asyncio.sleep(3600)


def test_cancel_pending_ends_a_task_that_survives_a_cancel_and_the_task_it_starts():
    loop, started, children = BackgroundLoop(), threading.Event(), []
    task = asyncio.run_coroutine_threadsafe(stubborn(started, children), loop.loop)
    assert started.wait(10)
    done = threading.Event()
    closer = threading.Thread(target=lambda: (loop.close(), done.set()), daemon=True)
    closer.start()
    assert done.wait(10), "cancel_pending waited on a task that survived its cancel"
    assert task.cancelled() and children and children[0].cancelled()
