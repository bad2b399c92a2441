"""Runs policies over workloads and rates and turns simulations into results.json records."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from fluidpd.core.profile import Profile
from fluidpd.core.types import SLO, Request
from fluidpd.sim.metrics import attainment, p95_ttft_series, run_metrics, windowed_attainment
from fluidpd.sim.policies import MECHANISMS
from fluidpd.sim.simulator import SimConfig, simulate
from fluidpd.sim.workloads import Workload, build_workload


@dataclass(frozen=True, slots=True)
class RunSpec:
    """Everything that determines one simulated run (picklable for worker processes): the
    policy, the workload at a rate, and the deployment it runs on (``base``, whose
    mechanisms the policy replaces)."""

    policy: str
    workload: str
    rps: float
    base: SimConfig
    num_requests: int | None = None

    @property
    def profile(self) -> Profile:
        return self.base.profile

    @property
    def slo(self) -> SLO:
        return self.base.slo

    @property
    def seed(self) -> int:
        return self.base.seed

    @property
    def pd(self) -> str:
        return f"{self.base.n_prefill}P{self.base.n_decode}D"

    def sim_config(self, n_prefill: int | None = None, n_decode: int | None = None) -> SimConfig:
        return replace(
            self.base,
            mechanisms=MECHANISMS.get(self.policy, MECHANISMS["static"]),
            n_prefill=self.base.n_prefill if n_prefill is None else n_prefill,
            n_decode=self.base.n_decode if n_decode is None else n_decode,
        )

    def build_workload(self) -> Workload:
        return build_workload(
            self.workload,
            self.rps,
            seed=self.seed,
            context_limit=self.profile.context_limit,
            num_requests=self.num_requests,
        )


@dataclass(slots=True)
class RunOutput:
    """One run's ``results.json`` record (a function of the spec and seed only), its time
    series, and the wall seconds it took (measured: kept out of the record, so that two runs
    of one seed write byte-identical results.json; ``run.json`` has it)."""

    record: dict[str, Any]
    series: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None


def _header(spec: RunSpec) -> dict[str, Any]:
    return {
        "policy": spec.policy,
        "rps": spec.rps,
        "workload": spec.workload,
        "model": spec.profile.model,
        "gpu": spec.profile.gpu,
        "pd": spec.pd,
        "ttft_slo": spec.slo.ttft,
        "tpot_slo": spec.slo.tpot,
        "seed": spec.seed,
    }


def _sub_workload(w: Workload, a: int, b: int, label: str) -> Workload:
    base = float(w.arrivals[a])
    return Workload(
        name=f"{w.name}[{label}]",
        arrivals=w.arrivals[a:b] - base,
        prompt_lens=w.prompt_lens[a:b],
        output_lens=w.output_lens[a:b],
        windows=(("all", 0, b - a),),
        description=f"window {label} of {w.name}",
    )


def _run_simulated(spec: RunSpec, workload: Workload) -> RunOutput:
    t0 = time.perf_counter()
    result = simulate(workload, spec.sim_config())
    wall = time.perf_counter() - t0
    record = _header(spec)
    record.update(run_metrics(result.requests, spec.slo))
    record.update(
        {
            "role_switches": [s.as_dict() for s in result.switches],
            "stolen_tokens": result.stolen_tokens,
            "capped_prompts": workload.capped_prompts,
            "window_attainment": windowed_attainment(result.requests, workload.windows, spec.slo),
            "scale_outs": result.scale_outs,
            "events": result.events,
            "predictor_mre": result.predictor_mre,
        }
    )
    bins_t, p95 = p95_ttft_series(result.requests, 10.0, spec.base.timeout_s)
    series: dict[str, object] = dict(result.series.as_dict())
    series["p95_ttft_t"] = bins_t
    series["p95_ttft"] = p95
    return RunOutput(record, series, round(wall, 3))


def run_oracle(spec: RunSpec, workload: Workload) -> RunOutput:
    """Best static split per workload window in hindsight, reconfigured instantly at window
    edges (each window replayed on a fresh deployment of that split); with one window (mixed)
    this is the best single static split."""
    t0 = time.perf_counter()
    n = spec.base.n_prefill + spec.base.n_decode
    chosen: list[Request] = []
    switches: list[dict[str, object]] = []
    splits: dict[str, str] = {}
    previous = spec.pd
    for label, a, b in workload.windows:
        if b <= a:
            continue
        sub = _sub_workload(workload, a, b, label)
        best: tuple[float, int, list[Request]] | None = None
        for p in range(1, n):
            static = replace(spec, policy="static")
            reqs = simulate(sub, static.sim_config(n_prefill=p, n_decode=n - p)).requests
            score = attainment(reqs, spec.slo)
            if best is None or score > best[0]:
                best = (score, p, reqs)
        assert best is not None
        _, p, reqs = best
        offset = float(workload.arrivals[a])
        for r in reqs:
            r.arrival += offset
            r.first_token_t += offset
            r.finish_t += offset
        chosen.extend(reqs)
        split = f"{p}P{n - p}D"
        splits[label] = split
        if split != previous:
            switches.append(
                {
                    "t": round(offset, 3),
                    "worker": "all",
                    "from": previous,
                    "to": split,
                    "drain_s": 0.0,
                }
            )
        previous = split
    record = _header(spec)
    record.update(run_metrics(chosen, spec.slo))
    record.update(
        {
            "role_switches": switches,
            "stolen_tokens": 0,
            "window_attainment": windowed_attainment(chosen, workload.windows, spec.slo),
            "oracle_splits": splits,
            "capped_prompts": workload.capped_prompts,
            "scale_outs": [],
        }
    )
    return RunOutput(record, wall_s=round(time.perf_counter() - t0, 3))


def run_one(spec: RunSpec) -> RunOutput:
    workload = spec.build_workload()
    if spec.policy == "oracle":
        return run_oracle(spec, workload)
    return _run_simulated(spec, workload)


def run_many(
    specs: Iterable[RunSpec], jobs: int = 1, progress: Callable[[RunOutput], None] | None = None
) -> list[RunOutput]:
    """Runs specs (in worker processes when ``jobs`` > 1); results keep the input order."""
    spec_list = list(specs)
    outputs: list[RunOutput] = []

    def _consume(it: Iterator[RunOutput]) -> None:
        for out in it:
            outputs.append(out)
            if progress is not None:
                progress(out)

    if jobs <= 1 or len(spec_list) <= 1:
        _consume(run_one(s) for s in spec_list)
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(spec_list))) as pool:
            _consume(pool.map(run_one, spec_list))
    return outputs


def default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))
