"""Wakes SGLang's idle scheduler when FluidPD hands it a command.

With ``--sleep-on-idle`` (the sidecar passes it on CPU, ``server.py``) a fully idle scheduler
blocks in a zmq poll of its tokenizer and RPC sockets for up to 1 s per loop instead of
spinning. FluidRole's commands (``roleswitch``) arrive through the hook's HTTP thread, not
through those sockets, and are taken exactly when the scheduler is idle (the sidecar drains it
first), so each would wait for the poll to time out. The read end of a pipe joins that poll: a
command writes one byte, the poll returns at once, and the scheduler empties the pipe after it.

Standard library and SGLang only: this module is imported by SGLang's interpreter.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

_pipe: dict[str, int] = {}
_lock = threading.Lock()


def _fds() -> tuple[int, int]:
    with _lock:
        if not _pipe:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            _pipe.update(r=r, w=w)
        return _pipe["r"], _pipe["w"]


def wake() -> None:
    """From any thread: end the scheduler's current idle wait (no-op when it is busy)."""
    _, w = _fds()
    # A full pipe holds wake-ups enough already.
    with contextlib.suppress(BlockingIOError):
        os.write(w, b"\0")


def _drain() -> None:
    r, _ = _fds()
    # One read takes all a pipe holds (64 KiB at most on Linux); an empty one raises.
    with contextlib.suppress(BlockingIOError):
        os.read(r, 1 << 16)


def install(cls: Any) -> None:
    """Patch SGLang's ``Scheduler`` (scheduler process): after construction the pipe joins the
    idle sleeper's poll (when ``--sleep-on-idle`` made one); after each idle wait it is emptied,
    so the next wait blocks again."""
    for name in ("__init__", "maybe_sleep_on_idle"):
        if not callable(getattr(cls, name, None)):
            raise RuntimeError(f"FluidPD: SGLang's Scheduler has no {name}; not 0.5.17?")
    init, sleep = cls.__init__, cls.maybe_sleep_on_idle

    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        sleeper = getattr(self, "idle_sleeper", None)
        if sleeper is not None:
            import zmq  # noqa: PLC0415 - SGLang's dependency, in its interpreter only

            sleeper.poller.register(_fds()[0], zmq.POLLIN)

    def maybe_sleep_on_idle(self: Any) -> None:
        sleep(self)
        _drain()

    cls.__init__ = patched_init
    cls.maybe_sleep_on_idle = maybe_sleep_on_idle
