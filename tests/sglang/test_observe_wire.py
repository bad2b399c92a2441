"""The pure halves of the sglang backend: the hook snapshot as FluidPD's pressure report, and
FluidPD's requests as SGLang bodies (no SGLang needed)."""

from __future__ import annotations

import pytest

from fluidpd.api.sampling import SamplingParams
from fluidpd.core.signals import dpi_adm, dpi_load
from fluidpd.core.types import SLO, Role
from fluidpd.profiles import resolve_profile
from fluidpd_sidecar.sglang.observe import pressure_report, step_gauges
from fluidpd_sidecar.sglang.server import SglangConfig, server_command, server_env
from fluidpd_sidecar.sglang.wire import generate_body, new_tokens

PROFILE = resolve_profile("llama-3.1-8b", "a100-80gb", None)
SLO_ = SLO(ttft=2.0, tpot=0.1)


def _entry(rid: str, n: int, t: float) -> dict[str, object]:
    return {"rid": rid, "prompt_len": n, "arrival": t}


def test_prefill_queue_is_bootstrap_plus_waiting_with_router_arrivals() -> None:
    now = 1000.0
    snap = {
        "kv_capacity": 1000,
        "bootstrap": [_entry("1", 4000, now - 0.1)],
        "waiting": [_entry("2", 8000, now - 0.05)],
    }
    late = pressure_report(snap, worker="p", role=Role.PREFILL, profile=PROFILE, slo=SLO_,
                           arrivals={"1": now - 1.9}, now=now)  # fmt: skip
    early = pressure_report(snap, worker="p", role=Role.PREFILL, profile=PROFILE, slo=SLO_,
                            arrivals={}, now=now)  # fmt: skip
    assert late.queue_len == early.queue_len == 2
    # The router's arrival (1.9 s ago) leaves request 1 almost no TTFT budget.
    assert late.queue_ppi > early.queue_ppi > 0
    # Only the bootstrapped (waiting) request counts for the attributable signal.
    assert late.attributable_ppi == early.attributable_ppi < early.queue_ppi
    assert late.drain_cost > 0 and late.batch == 0 and late.steal_budget == 0


def test_decode_pressure_separates_pre_allocated_from_active_kv() -> None:
    snap = {
        "kv_capacity": 10_000,
        "kv_used": 6_000,
        "kv_pre_allocated": 2_000,
        "decode_batch": 8,
        "decode_context": 4_000,
        "prealloc": [_entry("9", 100, 0.0)],
        "transfer": [_entry("8", 100, 0.0)],
        "waiting": [],
    }
    p = pressure_report(snap, worker="d", role=Role.DECODE, profile=PROFILE, slo=SLO_,
                        arrivals={}, now=0.0, in_flight=3)  # fmt: skip
    assert (p.kv_used, p.kv_reserved, p.kv_capacity, p.batch) == (4_000, 2_000, 10_000, 8)
    assert p.queue_len == 2 and p.drain_cost == 10 and not p.drained
    # Only the prealloc queue waits for KV room (the transfer's KV is allocated).
    assert p.kv_waiting == 1
    assert p.dpi_adm == pytest.approx(dpi_adm(10_000 - 4_000 - 2_000, 10_000))
    assert p.dpi_load == pytest.approx(dpi_load(4_000, 10_000, 8, PROFILE.n_tpot(0.1, 500.0)))


def test_empty_snapshot_is_an_idle_drained_worker() -> None:
    p = pressure_report({}, worker="d", role=Role.DECODE, profile=PROFILE, slo=SLO_,
                        arrivals={}, now=0.0)  # fmt: skip
    assert p.drained and p.batch == 0 and p.queue_len == 0


def test_generate_body_carries_bootstrap_and_sampling() -> None:
    s = SamplingParams(max_new_tokens=7, temperature=0.0, top_k=0, seed=3, stop_token_ids=[9],
                       logprobs=True, top_logprobs=2)  # fmt: skip
    body = generate_body(12, [1, 2, 3], s, ("10.0.0.1", 8998), stream=True)
    assert body["bootstrap_room"] == 12 and body["bootstrap_host"] == "10.0.0.1"
    sp = body["sampling_params"]
    assert sp["top_k"] == -1 and sp["sampling_seed"] == 3 and sp["stop_token_ids"] == [9]
    assert body["return_logprob"] and body["top_logprobs_num"] == 2 and body["rid"] == "12"
    assert "bootstrap_room" not in generate_body(1, [1], s, None, stream=False)


def test_new_tokens_reads_cumulative_chunks_and_the_finish() -> None:
    tops = [[[-0.5, 4, None]], [[-1.0, 5, None], [-2.0, 6, None]]]
    meta = {"output_token_logprobs": [[-0.5, 4, None], [-1.0, 5, None]],
            "output_top_logprobs": tops}  # fmt: skip
    first = new_tokens({"output_ids": [4], "meta_info": {**meta, "finish_reason": None}}, 0)
    rest = new_tokens({"output_ids": [4, 5], "meta_info": {**meta,
                       "finish_reason": {"type": "length"}}}, 1)  # fmt: skip
    assert [t.id for t in first] == [4] and first[0].finish is None
    assert [t.id for t in rest] == [5] and rest[0].finish == "length"
    assert rest[0].logprob == -1.0 and rest[0].top == ((5, -1.0), (6, -2.0))
    with pytest.raises(RuntimeError, match="aborted"):
        new_tokens({"output_ids": [], "meta_info": {"finish_reason": {"type": "abort"}}}, 0)


def test_command_line_passes_model_gpu_and_memory_through() -> None:
    cfg = SglangConfig(python="py", model_dir="/m", port=1, hook_port=2, device="cuda:3",  # type: ignore[arg-type]
                       mem_fraction=0.4, mode="prefill", bootstrap_port=5,
                       transfer_backend="mooncake", dtype="float32")  # fmt: skip
    argv = server_command(cfg)
    joined = " ".join(argv)
    assert "--model-path /m" in joined and "--mem-fraction-static 0.4" in joined
    assert "--dtype float32" in joined
    assert (
        "--disaggregation-mode prefill" in joined and "--disaggregation-bootstrap-port 5" in joined
    )
    env = server_env(cfg, {})
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["FLUIDPD_SGLANG_HOOK_PORT"] == "2"
    assert env["MC_FORCE_TCP"] == "1" and "cpu_stubs" not in env["PYTHONPATH"]
    cpu = server_command(SglangConfig(python="py", model_dir="/m", port=1, hook_port=2,  # type: ignore[arg-type]
                                      device="cpu"))  # fmt: skip
    assert "--disable-overlap-schedule" in cpu and "--device" in cpu
    # A CPU scheduler sleeps when idle (it would spin on a core the forwards need); a GPU one
    # keeps SGLang's default.
    assert "--sleep-on-idle" in cpu and "--sleep-on-idle" not in argv


def test_step_gauges_are_medians_by_kind() -> None:
    steps = [{"kind": "decode", "dur": d} for d in (0.005, 0.006, 0.007)]
    steps += [{"kind": "extend", "dur": 0.03}, {"kind": "idle", "dur": 9.0}]
    assert step_gauges({"steps": steps}) == {"decode": (0.006, 3), "extend": (0.03, 1)}
    assert step_gauges({}) == {}
