"""``Batched``: calls made one by one on the event loop, run together in one job on the
engine's thread.

A migrate drain exports (source) and loads (target) many requests' KV at once, each request
on a task of its own. One engine job per request would queue each behind the decode step in
flight and interleave them with further steps; a ``Batched`` job takes every item submitted
until the thread reaches it, so N requests cost one wait for the thread and one job.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def _settle(fut: asyncio.Future[R], result: R | BaseException) -> None:
    if fut.done():
        return  # its caller was cancelled
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)


class Batched(Generic[T, R]):
    """``job(items)`` returns one result per item, or an exception instance for an item that
    failed; an exception raised by ``job`` fails the whole batch."""

    def __init__(self, pool: Executor, job: Callable[[list[T]], Sequence[R | BaseException]]):
        self._pool = pool
        self._job = job
        self._lock = threading.Lock()
        self._items: list[tuple[T, asyncio.Future[R]]] = []
        self._scheduled = False
        #: Jobs run and items they took (the drain report's "one job for N requests").
        self.jobs = 0
        self.items = 0

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        with self._lock:
            self._items.append((item, fut))
            start = not self._scheduled
            self._scheduled = True
        if start:
            try:
                await asyncio.sleep(0)  # the other tasks ready now submit theirs into this job
            finally:  # even if this caller is cancelled: the others wait for the job
                loop.run_in_executor(self._pool, self._take_and_run, loop)
        return await fut

    def _take_and_run(self, loop: asyncio.AbstractEventLoop) -> None:
        """The engine thread: every item submitted so far, in one job."""
        with self._lock:
            taken, self._items = self._items, []
            self._scheduled = False
        if not taken:
            return
        self.jobs += 1
        self.items += len(taken)
        results: Sequence[R | BaseException]
        try:
            results = self._job([item for item, _ in taken])
        except Exception as exc:
            results = [exc] * len(taken)
        for (_, fut), result in zip(taken, results, strict=True):
            loop.call_soon_threadsafe(_settle, fut, result)
