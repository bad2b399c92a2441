"""``fluidpd profile``: measure the gpu engine's step times and fit a profile from them.

Measures prefill, suffix-extend and decode-iteration latencies (and the KV hand-off and role
switch) on the ``gpu`` backend, fits the profile model's coefficients
(``fluidpd.core.profile_fit``), reports each predictor's mean relative error, and writes a
profile YAML in the same format as the shipped ones plus a JSON report with every point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import yaml

from fluidpd.cli.errors import UserError
from fluidpd.cli.options import (
    add_float,
    add_gpu_engine_options,
    add_model_dir_option,
    check_gpu_devices,
    non_negative_float,
    positive_int,
)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the notes) as ``|`` blocks, like the hand-written profiles."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "profile",
        help="measure the gpu engine and fit a profile (prefill, suffix, decode, MRE)",
        description="Times prefill, suffix extends and decode iterations on the gpu engine, "
        "fits the profile coefficients and writes a profile YAML and a JSON report.",
    )
    add_model_dir_option(p)
    add_gpu_engine_options(p)
    p.add_argument("--gpu", default="h200", help="GPU label in the profile name (default h200)")
    p.add_argument("--name", default=None, help="profile name (default <model>-<gpu>)")
    p.add_argument("--out", required=True, help="profile YAML to write")
    p.add_argument(
        "--from-report",
        default=None,
        help="refit from the measurements of an earlier JSON report (no GPU, no measuring; "
        "default: measure)",
    )
    p.add_argument("--report", default=None, help="JSON report (default: --out with .json)")
    p.add_argument(
        "--kv-tokens",
        type=positive_int,
        default=None,
        help="KV pool of one worker, tokens (default on CUDA: 85%% of free memory after weights)",
    )
    p.add_argument(
        "--context-limit",
        type=positive_int,
        default=16384,
        help="longest prompt + output the profile allows, tokens",
    )
    p.add_argument(
        "--max-running",
        type=positive_int,
        default=256,
        help="most requests one worker runs at once (the profile's max_running_requests)",
    )
    p.add_argument("--quick", action="store_true", help="small grid (CPU checks, CI)")
    p.add_argument(
        "--repeat",
        type=positive_int,
        default=None,
        help="fewest runs per point (default 5; 2 with --quick)",
    )
    p.add_argument(
        "--min-time",
        type=non_negative_float,
        default=None,
        help="seconds of runs per point at least (default 0.25; 0 with --quick)",
    )
    add_float(p, "--max-mre", 0.10, "exit 1 if any predictor's mean relative error is above")
    p.set_defaults(func=run)


def _pool_tokens(args: argparse.Namespace, bytes_per_token: int, weight_bytes: int) -> int:
    if args.kv_tokens:
        return int(args.kv_tokens)
    if not args.device.startswith("cuda"):
        raise UserError("--kv-tokens: required when --device is not cuda")
    import torch

    free, _ = torch.cuda.mem_get_info()
    spare = free * 0.85 - weight_bytes - (6 << 30)
    if spare < bytes_per_token * args.context_limit:
        raise UserError(f"--device: only {free >> 20} MiB free, too little for the KV pool")
    return int(spare // bytes_per_token)


def run(args: argparse.Namespace) -> int:
    from fluidpd_sidecar.gpu.config import ModelConfig
    from fluidpd_sidecar.gpu.factory import model_config

    report: dict[str, Any] | None = None
    if args.from_report:
        try:
            report = json.loads(Path(args.from_report).read_text())
            cfg = ModelConfig.from_json(report["shape"])
            args.dtype = report["dtype"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"--from-report: cannot read a profile report: {exc}") from exc
    else:
        try:
            cfg = model_config(args.gpu_model, args.model_dir)
        except ValueError as exc:
            raise UserError(
                f"{'--model-dir' if args.model_dir else '--engine-model'}: {exc}"
            ) from None
    out = Path(args.out)
    report_path = Path(args.report) if args.report else out.with_suffix(".json")
    for path, opt in ((out, "--out"), (report_path, "--report")):
        if path.exists() and path.is_dir():
            raise UserError(f"{opt}: {path} is a directory")
    if report is None:
        report = _measure(args, cfg)
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(report, indent=1) + "\n")
    return _fit_and_write(args, cfg, report, out, report_path)


def _measure(args: argparse.Namespace, cfg: Any) -> dict[str, Any]:
    """Runs the engine over the grid; the report holds every point (refit with --from-report)."""
    import torch

    from fluidpd.core.types import Role
    from fluidpd_sidecar.gpu import profiler
    from fluidpd_sidecar.gpu.engine import GpuEngine
    from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions

    check_gpu_devices([args.device])
    esize = torch.empty(0, dtype=getattr(torch, args.dtype)).element_size()
    bpt = cfg.kv_bytes_per_token * esize // 2
    weight_bytes = cfg.params()["total"] * esize
    pool = _pool_tokens(args, bpt, weight_bytes)
    max_batch = min(args.max_running, 256)
    if pool - 16 * max_batch < args.context_limit:
        raise UserError(
            f"--kv-tokens: a pool of {pool} tokens holds less than one --context-limit "
            f"({args.context_limit}) once {max_batch} running requests' page rounding is kept"
        )
    opts = RunnerOptions(
        device=args.device, dtype=args.dtype, seed=args.weight_seed, model_dir=args.model_dir,
        kv_tokens=pool, max_context=args.context_limit, max_batch=max_batch,
    )  # fmt: skip
    grid = profiler.quick_grid() if args.quick else profiler.Grid()
    if args.repeat:
        grid.repeat = args.repeat
    if args.min_time is not None:
        grid.min_time_s = args.min_time
    t_start = time.time()
    runner = ModelRunner(cfg, opts)
    engine = GpuEngine(runner, Role.PREFILL)
    print(f"{cfg.name}: weights ready in {runner.load_s:.1f} s; pool {pool} tokens", flush=True)
    pre = profiler.measure_prefill(runner, grid)
    suf = profiler.measure_suffix(runner, grid)
    switch: dict[str, Any] = {
        "first_p_to_d_s": asyncio.run(engine.switch_role(Role.DECODE)),
        "graph_capture_s": runner.graph_stats.capture_s,
        "graph_buckets": runner.graph_stats.buckets,
    }
    dec = profiler.measure_decode(runner, grid)
    switch["d_to_p_s"] = asyncio.run(engine.switch_role(Role.PREFILL))
    switch["p_to_d_s"] = asyncio.run(engine.switch_role(Role.DECODE))
    switch["weights_unmoved"] = all(s["weights_unmoved"] for s in engine.stats.switches)
    xfer = profiler.measure_transfer(runner, grid)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    return {
        "device": device,
        "date": time.strftime("%Y-%m-%d"),
        "shape": cfg.to_json(),
        "dtype": args.dtype,
        "element_size": esize,
        "weights": args.model_dir or f"seeded ({args.weight_seed})",
        "pool_tokens": pool,
        "page_size": opts.page_size,
        "context_limit": args.context_limit,
        "max_running": max_batch,
        "prefill": pre,
        "suffix": suf,
        "decode": dec,
        "transfer": xfer,
        "switch": switch,
        "wall_s": time.time() - t_start,
    }


def _fit_and_write(
    args: argparse.Namespace, cfg: Any, report: dict[str, Any], out: Path, report_path: Path
) -> int:
    import numpy as np

    from fluidpd.core import profile_fit as pf
    from fluidpd.core.profile import Profile
    from fluidpd_sidecar.gpu.config import SHAPE_SOURCES

    def arr(rows: list[dict[str, float]], key: str) -> Any:
        return np.array([r[key] for r in rows], dtype=np.float64)

    pre, suf, dec, xfer = report["prefill"], report["suffix"], report["decode"], report["transfer"]
    switch = report["switch"]
    try:
        f_pre = pf.fit_quadratic(arr(pre, "tokens"), arr(pre, "s"))
        prefix = np.array([r.get("prefix", 0) for r in suf], dtype=np.float64)
        f_suf = pf.fit_suffix(arr(suf, "tokens"), prefix, arr(suf, "s"))
        f_dec = pf.fit_decode(arr(dec, "batch"), arr(dec, "context"), arr(dec, "s"))
        f_xfer = pf.fit_transfer(arr(xfer, "bytes"), arr(xfer, "s"))
    except (ValueError, KeyError) as exc:
        raise UserError(f"--quick/--context-limit: cannot fit: {exc}") from exc
    esize = int(report.get("element_size", 2))
    context_limit = int(report.get("context_limit", args.context_limit))
    max_batch = int(report.get("max_running", min(args.max_running, 256)))
    pool = int(report["pool_tokens"])
    page = int(report.get("page_size", 16))
    name = args.name or f"{cfg.name}-{args.gpu}"
    mre = {"prefill": f_pre.mre, "suffix": f_suf.mre, "decode": f_dec.mre}
    points = str(report_path)
    sources = [f"{url} (shape) [cited]" for url in SHAPE_SOURCES.get(cfg.name, [])]
    sources.append(
        f"fluidpd/fluidpd@{report.get('date', 'local')}:{report_path} "
        f"(the measured points: `fluidpd profile` on {report.get('device', '?')})"
    )
    data: dict[str, Any] = {
        "name": name,
        "model": cfg.name,
        "gpu": args.gpu,
        "context_limit": context_limit,
        "max_running_requests": max_batch,
        "typical_context_tokens": 2048,
        "prefill": {
            "c1_ms_per_token": f_pre.coef[1] * 1e3,
            "c0_ms": f_pre.coef[2] * 1e3,
            "c2_ms_per_token2": f_pre.coef[0] * 1e3,
        },
        "suffix": {
            "s1_ms_per_token": f_suf.coef[1] * 1e3,
            "s0_ms": f_suf.coef[2] * 1e3,
            "s2_ms_per_token2": f_suf.coef[0] * 1e3,
            "sp_ms_per_token2": f_suf.coef[3] * 1e3,
        },
        "decode": {
            "a_c_ms_per_token": f_dec.coef[0] * 1e3,
            "a_n_ms_per_request": f_dec.coef[1] * 1e3,
            "a_0_ms": max(f_dec.coef[2] * 1e3, 1e-6),
        },
        "kv": {
            "capacity_tokens": pool - page * max_batch,
            "bytes_per_token": cfg.kv_bytes_per_token * esize // 2,
            "reserve_output_clip": 4096,
        },
        "transfer": {
            "bandwidth_gb_per_s": 1e-9 / f_xfer.coef[0],
            "base_latency_ms": f_xfer.coef[1] * 1e3,
        },
        "switch": {
            "to_decode_ms": switch["p_to_d_s"] * 1e3,
            "to_prefill_ms": switch["d_to_p_s"] * 1e3,
        },
        "sources": sources,
        "notes": (
            f"Measured on {report.get('device', '?')} ({report.get('date', '?')}) by `fluidpd "
            f"profile` on the gpu engine ({cfg.name} shape, {report.get('dtype')}, "
            f"{report.get('weights', 'seeded')} weights); every point is in {points}.\n"
            f"MODEL [cited]: {cfg.layers} layers, {cfg.heads} query heads, {cfg.kv_heads} KV "
            f"heads, head_dim {cfg.head_dim}, hidden {cfg.hidden}, intermediate "
            f"{cfg.intermediate}, vocab {cfg.vocab} (the published config.json).\n"
            f"kv_bytes_per_token [derived]: {cfg.layers} layers x {cfg.kv_heads} kv_heads x "
            f"{cfg.head_dim} head_dim x 2 (K,V) x {esize} bytes = "
            f"{cfg.kv_bytes_per_token * esize // 2}\n"
            f"FIT [derived]: relative least squares with coefficients >= 0 "
            f"(fluidpd.core.profile_fit). Mean relative error: prefill {f_pre.mre:.3f} (max "
            f"{f_pre.max_re:.3f}, {f_pre.n} points), suffix {f_suf.mre:.3f} (max "
            f"{f_suf.max_re:.3f}, {f_suf.n}), decode {f_dec.mre:.3f} (max {f_dec.max_re:.3f}, "
            f"{f_dec.n}).\n"
            f"TRANSFER [derived]: shm hand-off through pinned host memory (stage + copy + load), "
            f"fit MRE {f_xfer.mre:.3f}.\n"
            f"SWITCH: in place, weights unmoved; decode CUDA graphs captured on the first "
            f"switch to decode ({switch.get('graph_capture_s', 0.0) * 1e3:.0f} ms, "
            f"{len(switch.get('graph_buckets', []))} batch buckets) and kept; to_decode_ms is a "
            f"later switch with the graphs cached.\n"
            f"KV capacity: the pool of {pool} tokens less one page ({page} tokens) per running "
            f"request. typical_context_tokens 2048 [est] (display only); reserve_output_clip "
            f"4096 is SGLang's default [cited].\n"
        ),
    }
    profile = Profile.model_validate(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = f"# {name}: measured by `fluidpd profile` on the gpu engine; see notes.\n"
    body = yaml.dump(profile.model_dump(), Dumper=_Dumper, sort_keys=False, width=100)
    out.write_text(header + body)
    report["mre"] = mre
    report["max_re"] = {"prefill": f_pre.max_re, "suffix": f_suf.max_re, "decode": f_dec.max_re}
    report["transfer_mre"] = f_xfer.mre
    report["profile"] = name
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"{name}: MRE prefill {f_pre.mre:.1%}, suffix {f_suf.mre:.1%}, decode {f_dec.mre:.1%}; "
        f"wrote {out} and {report_path}",
        flush=True,
    )
    worst = max(mre.values())
    if worst > args.max_mre:
        print(f"fluidpd profile: MRE {worst:.1%} is above --max-mre {args.max_mre:.0%}")
        return 1
    return 0
