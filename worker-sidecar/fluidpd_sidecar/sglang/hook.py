"""Runs inside SGLang's scheduler process: records what FluidPD's signals need and serves it.

SGLang's own ``/get_load`` and Prometheus gauges lack the queue contents (arrival times and
prompt lengths), the decode side's pre-allocated KV separated from active KV, and per-step
times (its gauges are also written only every 40 decode steps). This hook wraps
``Scheduler.run_batch`` to time every step and keeps a reference to the scheduler; a daemon
thread answers ``GET /`` on ``127.0.0.1:$FLUIDPD_SGLANG_HOOK_PORT`` with a JSON snapshot read
from the scheduler's own queues. Reads only: lists are copied under the GIL before they are
walked, and nothing here mutates scheduler state.

Standard library, SGLang and (through ``fluidtoken_hook``) FluidPD's pure core only: this
module is imported by SGLang's interpreter.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fluidpd_sidecar.sglang import fluidtoken_hook, idle_wake, roleswitch

PORT_ENV = "FLUIDPD_SGLANG_HOOK_PORT"
#: Steps kept for the step-time window of a snapshot.
STEPS_KEPT = 256

_state: dict[str, Any] = {"scheduler": None, "steps": deque(maxlen=STEPS_KEPT), "n_steps": 0}
_lock = threading.Lock()


def _unix(perf: float) -> float:
    """SGLang stamps queue entries with ``perf_counter``; the sidecar's clock is UNIX time."""
    if not perf:
        return 0.0
    return time.time() - (time.perf_counter() - perf)


def _entry(req: Any) -> dict[str, Any]:
    ts = getattr(req, "time_stats", None)
    perf = 0.0
    if ts is not None:
        perf = getattr(ts, "wait_queue_entry_time", 0.0) or getattr(
            ts, "prefill_bootstrap_queue_entry_time", 0.0
        )
    return {
        "rid": str(req.rid),
        "prompt_len": len(req.origin_input_ids),
        "arrival": _unix(perf),
    }


def _queue_reqs(q: Any) -> list[Any]:
    if q is None:
        return []
    items = list(getattr(q, "queue", q))
    # Disaggregation queues hold DecodeRequest wrappers around the Req.
    return [getattr(x, "req", x) for x in items]


def snapshot() -> dict[str, Any]:
    s = _state["scheduler"]
    if s is None:
        return {"ready": False}
    waiting = [_entry(r) for r in list(s.waiting_queue)]
    bootstrap = [_entry(r) for r in _queue_reqs(s.disagg_prefill_bootstrap_queue)]
    prealloc = [_entry(r) for r in _queue_reqs(s.disagg_decode_prealloc_queue)]
    transfer = [_entry(r) for r in _queue_reqs(s.disagg_decode_transfer_queue)]
    running = list(s.running_batch.reqs)
    capacity = int(s.max_total_num_tokens)
    free = int(s.token_to_kv_pool_allocator.available_size())
    evictable = 0
    tree = getattr(s, "tree_cache", None)
    if tree is not None and hasattr(tree, "evictable_size"):
        evictable = int(tree.evictable_size())
    pre_allocated = 0
    if s.disagg_decode_prealloc_queue is not None:
        pre_allocated = int(s.disagg_decode_prealloc_queue.num_tokens_pre_allocated)
    with _lock:
        steps = list(_state["steps"])
        n_steps = _state["n_steps"]
    return {
        "ready": True,
        "pid": os.getpid(),
        "mode": str(s.disaggregation_mode.value),
        "t": time.time(),
        "waiting": waiting,
        "bootstrap": bootstrap,
        "prealloc": prealloc,
        "transfer": transfer,
        "chunked": s.chunked_req is not None,
        "decode_batch": len(running),
        "decode_context": sum(len(r.origin_input_ids) + len(r.output_ids) for r in running),
        "kv_capacity": capacity,
        # Used slots minus what the radix cache could evict at once; the decode side's
        # pre-allocated (reserved for an incoming transfer) slots are part of used ones.
        "kv_used": capacity - free - evictable,
        "kv_pre_allocated": pre_allocated,
        "n_steps": n_steps,
        "steps": steps,
        **fluidtoken_hook.snapshot_fields(),
        **roleswitch.snapshot_fields(s),
    }


def _wrap_run_batch(cls: Any) -> None:
    original = cls.run_batch

    def run_batch(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        _state["scheduler"] = self
        t0 = time.perf_counter()
        out = original(self, batch, *args, **kwargs)
        dur = time.perf_counter() - t0
        mode = batch.forward_mode
        step = {
            "t": time.time(),
            # Wall time of the call; with SGLang's overlap scheduler the GPU work of a step
            # finishes later, so use the spacing of ``t`` under load for the step period.
            "dur": dur,
            "kind": "decode" if mode.is_decode() else ("extend" if mode.is_extend() else "idle"),
            "bs": batch.batch_size(),
            "tokens": int(getattr(batch, "extend_num_tokens", 0) or 0),
        }
        with _lock:
            _state["steps"].append(step)
            _state["n_steps"] += 1
        return out

    cls.run_batch = run_batch


def _wrap_init(cls: Any) -> None:
    original = cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _state["scheduler"] = self  # observable before the first batch runs
        fluidtoken_hook.bind(self)

    cls.__init__ = init


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        try:
            body = json.dumps(snapshot()).encode()
            code = 200
        except Exception as exc:  # a scheduler mid-update: say so, the sidecar retries
            body = json.dumps({"ready": False, "error": repr(exc)}).encode()
            code = 503
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        """FluidToken's splits and prefill forwards (``fluidtoken_hook.handle_post``: /split,
        /forget, /forwarded) and FluidRole's commands (``roleswitch``: /role, /unstarted, run on
        the scheduler's loop thread)."""
        try:
            n = int(self.headers.get("Content-Length", "0") or 0)
            args = json.loads(self.rfile.read(n) or b"{}")
            if self.path in ("/split", "/forget", "/forwarded"):
                code, out = fluidtoken_hook.handle_post(self.path, args)
            else:
                code, out = roleswitch.submit(self.path.strip("/"), args)
        except ValueError as exc:
            code, out = 400, {"error": f"bad JSON: {exc}"}
        body = json.dumps(out).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def install() -> None:
    """Patch SGLang's scheduler class and start the snapshot server (scheduler process only)."""
    from sglang.srt.managers.scheduler import Scheduler  # noqa: PLC0415 - SGLang's process only

    _wrap_init(Scheduler)
    _wrap_run_batch(Scheduler)
    idle_wake.install(Scheduler)
    fluidtoken_hook.install(Scheduler)
    if roleswitch.enabled():
        roleswitch.install(Scheduler)
    port = int(os.environ.get(PORT_ENV, "0") or 0)
    if port:
        server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        threading.Thread(target=server.serve_forever, name="fluidpd-hook", daemon=True).start()


def run_scheduler_process(*args: Any, **kwargs: Any) -> Any:
    """What SGLang spawns instead of its own ``run_scheduler_process``: install, then run it.

    SGLang starts schedulers with the ``spawn`` method, which pickles the target by module and
    name, so the child imports this module and the patches are made in the child itself.
    """
    install()
    from sglang.srt.managers.scheduler import (  # noqa: PLC0415 - after the patches
        run_scheduler_process as run,
    )

    return run(*args, **kwargs)
