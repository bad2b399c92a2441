"""FluidRole's Switch step inside SGLang 0.5.17: flip a running scheduler between prefill and
decode in place (same process, weights and KV pool untouched).

SGLang 0.5.17 fixes the role at construction; what differs between the roles
(shared/notes/sglang-internals.md section 3.2) is handled so:

* Every FluidRole worker is launched as a *decode* server (``server.py``), which gives the
  role-neutral superset: ChunkCache (radix off), the decode-flavoured req-to-token pool,
  decode CUDA graphs captured once at start (unused while it prefills). A prefill worker is
  flipped to prefill by the same switch right after start.
* A KV bootstrap server runs on every worker (``serve_bootstrap_everywhere``, in SGLang's
  main process), on one port for the worker's whole life.
* The per-role disaggregation state (queues, metadata buffers and their index allocator, the
  Mooncake KV manager) is built once per role and *kept* across flips: 0.5.17's Mooncake
  managers own threads with no stop and memory registered with the shared transfer engine.
  Keeping them means a re-born prefill has the same KV-manager endpoint, bootstrap
  registration and decode-peer registrations as before, so decode peers' caches of it stay
  valid; a worker's first flip into a role builds that role's set with SGLang's own
  ``Scheduler.init_disaggregation``.
* The switch is a control command executed on the scheduler's own loop thread (after
  ``process_input_requests``, where SGLang handles its own control requests), only when the
  scheduler is fully idle (the sidecar drains it first); then the running event loop is left
  by an exception and ``run_event_loop`` re-dispatches the other role's loop.

Also served here: re-pairing of queued-not-started requests (``unstarted``): on the loop
thread, so that nothing can start between the choice and the abort, the requests that have
not started are aborted with SGLang's own abort and their rids returned; the sidecar turns
them into FluidPD re-pairs (both halves aborted and re-issued by the router).

Tensor parallelism 1 only: with TP > 1 every rank would have to take the command at the same
iteration (SGLang broadcasts its own control requests from rank 0); FluidPD's SGLang workers
run TP 1.

Standard library and SGLang only: this module is imported by SGLang's interpreter.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from fluidpd_sidecar.sglang import idle_wake

#: Set by the sidecar for a FluidRole worker (``server.py``); unset, nothing is changed.
ENV = "FLUIDPD_SGLANG_FLUIDROLE"
ROLES = ("prefill", "decode")
#: Scheduler attributes that make up one role's disaggregation state (``init_disaggregation``).
KIT: dict[str, tuple[str, ...]] = {
    "prefill": (
        "disagg_prefill_bootstrap_queue",
        "disagg_prefill_inflight_queue",
        "req_to_metadata_buffer_idx_allocator",
        "disagg_metadata_buffers",
    ),
    "decode": (
        "disagg_decode_prealloc_queue",
        "disagg_decode_transfer_queue",
        "req_to_metadata_buffer_idx_allocator",
        "disagg_metadata_buffers",
    ),
}
QUEUES = (
    "disagg_prefill_bootstrap_queue",
    "disagg_prefill_inflight_queue",
    "disagg_decode_prealloc_queue",
    "disagg_decode_transfer_queue",
)
#: Scheduler components that copy the disaggregation mode at construction (0.5.17).
COMPONENTS = ("invariant_checker", "load_inquirer", "output_streamer", "batch_result_processor")


class _Restart(Exception):
    """Leaves the current role's event loop; ``run_event_loop`` dispatches the new one."""


@dataclass
class _Command:
    op: str
    args: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    code: int = 500
    result: dict[str, Any] = field(default_factory=dict)


_commands: queue.Queue[_Command] = queue.Queue()
_stats: dict[str, Any] = {"switches": 0, "last": None, "built": []}


def enabled() -> bool:
    return os.environ.get(ENV, "") == "1"


# -- called from the hook's HTTP thread ----------------------------------------------------------
def submit(op: str, args: dict[str, Any], timeout_s: float = 120.0) -> tuple[int, dict[str, Any]]:
    """Queue a command for the scheduler's loop thread and wait for its answer."""
    if op not in ("role", "unstarted"):
        return 404, {"error": f"unknown command {op!r}"}
    cmd = _Command(op, args)
    _commands.put(cmd)
    idle_wake.wake()  # an idle scheduler waits in a poll that this queue is not part of
    if not cmd.done.wait(timeout_s):
        return 504, {"error": f"the scheduler did not take the {op} command in {timeout_s:g} s"}
    return cmd.code, cmd.result


def snapshot_fields(s: Any) -> dict[str, Any]:
    """What the sidecar's drain needs beside the hook's snapshot (read-only)."""
    try:
        idle = bool(s.is_fully_idle())
    except Exception:  # a queue being rebuilt this instant: not idle
        idle = False
    return {"idle": idle, "switches": _stats["switches"], "last_switch": _stats["last"]}


# -- on the scheduler's loop thread -------------------------------------------------------------
def _run_commands(s: Any) -> None:
    restart = False
    while True:
        try:
            cmd = _commands.get_nowait()
        except queue.Empty:
            break
        try:
            if cmd.op == "role":
                cmd.code, cmd.result = _switch(s, str(cmd.args.get("role", "")))
                restart = restart or bool(cmd.result.get("switched"))
            else:
                cmd.code, cmd.result = 200, {"aborted": _abort_unstarted(s, cmd.args.get("rids"))}
        except Exception as exc:  # the answer says what broke; the loop goes on
            where = traceback.extract_tb(exc.__traceback__)[-1]
            cmd.code, cmd.result = (
                500,
                {"error": f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"},
            )
        finally:
            cmd.done.set()
    if restart:
        raise _Restart


def _switch(s: Any, target: str) -> tuple[int, dict[str, Any]]:
    if target not in ROLES:
        return 400, {"error": f"role must be one of {ROLES}, not {target!r}"}
    old = s.disaggregation_mode.value
    if old not in ROLES:
        return 409, {"error": f"not a P/D server (disaggregation mode {old!r})"}
    base = {"pid": os.getpid(), "role": old}
    if target == old:
        return 200, {**base, "switched": False}
    if not s.is_fully_idle():
        return 409, {**base, "error": "not idle: drain the worker first"}
    t0 = time.perf_counter()
    kits = s.__dict__.setdefault("_fluidpd_kits", {})
    kits[old] = {name: getattr(s, name) for name in KIT[old]}
    built = target not in kits
    try:
        _enter(s, target, kits.get(target))
    except Exception:
        # All or nothing: the old role's state is intact (it was only set aside).
        _enter(s, old, kits[old])
        raise
    if built:
        _stats["built"].append(target)
    dur = time.perf_counter() - t0
    _stats["switches"] += 1
    _stats["last"] = {"from": old, "to": target, "seconds": dur, "built": built, "t": time.time()}
    return 200, {"pid": os.getpid(), "role": target, "switched": True, "seconds": dur,
                 "built": built}  # fmt: skip


def _enter(s: Any, mode: str, kit: dict[str, Any] | None) -> None:
    """Makes ``mode`` the scheduler's role: its kept state ``kit``, or SGLang's own
    construction of it (``init_disaggregation``) the first time."""
    from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: PLC0415
    from sglang.srt.runtime_context import get_context  # noqa: PLC0415

    # Both records of the mode: the published config (``get_disagg()``, read by
    # ``init_disaggregation`` and per request) and the scheduler process's server args (read
    # by ``release_req`` on a decode retraction).
    get_context().override("fluidpd.roleswitch", disaggregation_mode=mode)
    s.server_args.override("fluidpd.roleswitch", disaggregation_mode=mode)
    if kit is None:
        s.init_disaggregation()
    else:
        for name in QUEUES:
            setattr(s, name, None)
        for name, value in kit.items():
            setattr(s, name, value)
        s.disaggregation_mode = DisaggregationMode(mode)
    for comp in COMPONENTS:
        obj = getattr(s, comp, None)
        if obj is not None:
            # Some are frozen dataclasses: the mode was meant to be set once, at construction.
            object.__setattr__(obj, "disaggregation_mode", s.disaggregation_mode)
    # The new loop starts from a clean slate (an idle scheduler has nothing here).
    s.last_batch = None
    s.cur_batch_for_debug = None


def _abort_unstarted(s: Any, rids: list[str] | None) -> list[str]:
    """Aborts the requests no compute or transfer has started for (all, or those of ``rids``)
    and returns their rids. Prefill: the bootstrap queue (the decode side has not sent its
    destination yet) and the waiting queue (bootstrapped, not scheduled; ``chunked_req`` has
    started). Decode: the pre-allocation queue (no KV reserved, so the prefill side, which
    waits for the reservation, has not started either)."""
    from sglang.srt.managers.io_struct import AbortReq  # noqa: PLC0415

    mode = s.disaggregation_mode.value
    reqs: list[Any] = []
    if mode == "prefill":
        reqs = [*s.disagg_prefill_bootstrap_queue.queue, *s.waiting_queue]
    elif mode == "decode":
        reqs = [d.req for d in s.disagg_decode_prealloc_queue.queue]
    wanted = None if rids is None else {str(r) for r in rids}
    chosen = [str(r.rid) for r in reqs if wanted is None or str(r.rid) in wanted]
    chunked = s.chunked_req
    chosen = [r for r in chosen if chunked is None or str(chunked.rid) != r]
    for rid in chosen:
        s.abort_request(AbortReq(rid=rid))
    return chosen


# -- installation -----------------------------------------------------------------------------
def install(cls: Any) -> None:
    """Patch SGLang's ``Scheduler`` (scheduler process; only for FluidRole workers)."""
    for name in ("process_input_requests", "run_event_loop", "init_disaggregation",
                 "is_fully_idle", "abort_request"):  # fmt: skip
        if not callable(getattr(cls, name, None)):
            raise RuntimeError(f"FluidRole: SGLang's Scheduler has no {name}; not 0.5.17?")
    process_input = cls.process_input_requests
    run_loop = cls.run_event_loop

    def process_input_requests(self: Any, recv_reqs: Any) -> Any:
        out = process_input(self, recv_reqs)
        if not _commands.empty():
            _run_commands(self)
        return out

    def run_event_loop(self: Any) -> None:
        while True:
            try:
                run_loop(self)
                return
            except _Restart:
                continue  # the role changed: dispatch its event loop

    cls.process_input_requests = process_input_requests
    cls.run_event_loop = run_event_loop


def serve_bootstrap_everywhere() -> None:
    """SGLang's main process: start the KV bootstrap server on a decode-launched worker too
    (0.5.17 starts it only for prefill), so the worker can become a prefill in place."""
    import sglang.srt.managers.tokenizer_manager as tm  # noqa: PLC0415
    from sglang.srt.disaggregation.utils import (  # noqa: PLC0415
        KVClassType,
        TransferBackend,
        get_kv_class,
    )

    original = tm.start_disagg_service

    def start_disagg_service(server_args: Any) -> Any:
        if server_args.disaggregation_mode != "decode":
            return original(server_args)
        backend = TransferBackend(server_args.disaggregation_transfer_backend)
        server_cls = get_kv_class(backend, KVClassType.BOOTSTRAP_SERVER)
        return server_cls(host=server_args.host, port=server_args.disaggregation_bootstrap_port)

    tm.start_disagg_service = start_disagg_service
