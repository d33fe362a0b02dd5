"""An asyncio event loop on its own thread, so synchronous code (the offline `LLM`) can drive async code.

A caller blocks on a future until the loop has its result: no polling. The thread is a daemon so that an `LLM`
left open cannot keep the interpreter from exiting (LLM closes itself at exit).
"""
import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
CANCEL_AGAIN_S = 0.5  # how long cancelled tasks get before those still running are cancelled again


class BackgroundLoop:
    def __init__(self, name: str = "tinyvllm-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` on the loop and waits for it. An interrupted wait (Ctrl-C) cancels it there too."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("BackgroundLoop.run from the loop's own thread would wait on itself")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """The items of an async generator, one blocking step at a time; stopping early closes it on the loop
        (running its `finally`) before returning."""
        try:
            while True:
                try:
                    item = self.run(_next(agen))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not self.loop.is_closed() and threading.current_thread() is not self._thread:
                self.run(agen.aclose())

    def cancel_pending(self) -> None:
        """Cancels every task still on the loop and closes every unfinished async generator (their `finally`
        blocks run now, while whatever they use is still open)."""
        self.run(_cancel_other_tasks())
        self.run(self.loop.shutdown_asyncgens())

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.cancel_pending()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _next(agen: AsyncIterator[T]) -> T:
    return await anext(agen)


async def _cancel_other_tasks() -> None:
    """Cancels until no other task is left: a task may survive one cancel (Python 3.11's asyncio.wait_for swallows
    a cancel that arrives as its inner future completes: an engine restart's start() did, and LLM's shutdown
    waited on that task forever) and start new ones."""
    while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=CANCEL_AGAIN_S)
