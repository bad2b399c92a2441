"""``fluidpd replay``: replay a workload against a live OpenAI-compatible endpoint.

The endpoint can be FluidPD's router or a plain SGLang/vLLM server; the results have the same
fields as ``fluidpd sim`` so real and simulated runs compare side by side.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm
from yarl import URL

from fluidpd.cli.errors import UserError
from fluidpd.cli.options import add_float, non_negative_int, positive_float, positive_int
from fluidpd.core.types import SLO
from fluidpd.replay.client import (
    EndpointUnreachable,
    Progress,
    ReplayConfig,
    fetch_admin_stats,
    list_models,
    replay,
)
from fluidpd.replay.results import (
    ReplayMeta,
    ResultsFileError,
    build_output,
    load_previous,
    load_series,
    requests_path,
    write_replay_results,
    write_request_log,
)
from fluidpd.sim.policies import POLICY_NAMES
from fluidpd.sim.report import report_text, series_key
from fluidpd.sim.workloads import WORKLOAD_NAMES, Workload, build_workload

DEFAULT_OUT = "out/replay"
DEFAULT_ENDPOINT = "http://127.0.0.1:8000"
DEFAULT_CONTEXT_LIMIT = 131072
STATS_INTERVAL_S = 1.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a workload against an OpenAI-compatible endpoint",
        description=(
            "Sends a workload's requests to an OpenAI-compatible server (FluidPD's router, "
            "SGLang, vLLM) at their arrival times, open loop, streaming, and measures TTFT/TPOT "
            "like sglang.bench_serving. Writes the same results.json fields and plots as "
            "`fluidpd sim`. If DIR/results.json exists the run is APPENDED to its runs, so "
            "replays with --label static and --label fluidpd into one --out compare in one "
            "table and one set of plots."
        ),
    )
    t = p.add_argument_group("endpoint")
    t.add_argument(
        "--endpoint",
        default=DEFAULT_ENDPOINT,
        help=f"base URL; a trailing /v1 is dropped (default {DEFAULT_ENDPOINT})",
    )
    t.add_argument(
        "--api",
        choices=("completions", "chat"),
        default="completions",
        help="/v1/completions or /v1/chat/completions (default completions)",
    )
    t.add_argument(
        "--served-model",
        default=None,
        help="model name sent in each request (default: the first id of GET /v1/models)",
    )
    t.add_argument(
        "--api-key",
        default=None,
        help="bearer token (default: $OPENAI_API_KEY, else $FLUIDPD_ADMIN_TOKEN, which a FluidPD "
        "router's /admin/stats needs, else 'none')",
    )
    t.add_argument(
        "--max-concurrency",
        type=positive_int,
        default=None,
        help="at most this many requests in flight; waiting for a slot counts toward TTFT "
        "(default: no limit)",
    )
    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload",
        default="azure-mixed",
        help=f"{', '.join(WORKLOAD_NAMES)}, or a trace CSV path (default azure-mixed)",
    )
    w.add_argument("--rps", type=positive_float, default=20.0, help="request rate (default 20)")
    w.add_argument(
        "--num-requests",
        type=positive_int,
        default=None,
        help="replay the first N requests (default: all)",
    )
    w.add_argument("--seed", type=non_negative_int, default=0, help="(default 0)")
    w.add_argument(
        "--context-limit",
        type=positive_int,
        default=DEFAULT_CONTEXT_LIMIT,
        help=f"cap prompt + output at this many tokens, as the simulator does "
        f"(default {DEFAULT_CONTEXT_LIMIT})",
    )
    w.add_argument(
        "--prompt-format",
        choices=("ids", "text"),
        default=None,
        help="ids: exact-length token-id lists (completions only); text: one word per token "
        "(default ids for completions, text for chat)",
    )
    s = p.add_argument_group("SLOs (seconds)")
    add_float(s, "--ttft-slo", 2.0, "TTFT target")
    add_float(s, "--tpot-slo", 0.1, "TPOT target")
    add_float(s, "--timeout", 60.0, "cancel and fail requests without a first token after this, s")
    r = p.add_argument_group("what the results record")
    r.add_argument(
        "--label",
        default="replay",
        help="the results' policy field, e.g. static or fluidpd (default replay)",
    )
    r.add_argument("--model-name", default="unknown", help="model recorded in the results")
    r.add_argument("--gpu", default="unknown", help="GPU recorded in the results")
    r.add_argument("--pd", default="unknown", help="P/D split recorded in the results, e.g. 4P4D")
    o = p.add_argument_group("output")
    o.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"output directory; an existing results.json there is appended to "
        f"(default {DEFAULT_OUT})",
    )
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    o.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def normalize_endpoint(text: str) -> str:
    """``scheme://host[:port][/prefix]`` without a trailing slash or ``/v1`` (the OpenAI
    clients' base-URL habit), so API paths can be appended."""
    # yarl: the URL type aiohttp (the replay's client) sends requests to, so the endpoint is
    # parsed and normalized as the requests will be.
    try:
        url = URL(text.strip())
    except (ValueError, TypeError):
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise UserError(f"--endpoint: expected an http(s) URL, got {text!r}")
    if url.query_string or url.fragment:
        raise UserError(f"--endpoint: expected a base URL without query or fragment, got {text!r}")
    base = str(url.with_path(url.path.rstrip("/"))).rstrip("/")
    return base.removesuffix("/v1")


def _label(text: str) -> str:
    label = text.strip()
    if not label or any(c in label for c in "/\\\n\r"):
        raise UserError(f"--label: expected a non-empty name without slashes, got {text!r}")
    return label


def _prompt_format(args: argparse.Namespace) -> str:
    chosen: str | None = args.prompt_format
    if chosen is None:
        return "text" if args.api == "chat" else "ids"
    if chosen == "ids" and args.api == "chat":
        raise UserError("--prompt-format: ids needs --api completions (chat takes text only)")
    return chosen


def _served_model(args: argparse.Namespace, endpoint: str, api_key: str) -> str:
    """Checks that the endpoint answers (before anything is sent) and picks the model name."""
    try:
        status, ids = list_models(endpoint, api_key)
    except EndpointUnreachable as exc:
        raise UserError(str(exc)) from None
    if args.served_model:
        return str(args.served_model)
    if not ids:
        raise UserError(
            f"--served-model: GET {endpoint}/v1/models gave HTTP {status} and no model id; "
            "name the model with --served-model"
        )
    return ids[0]


def _progress_bar(total: int, quiet: bool) -> tuple[Callable[[Progress], None], Callable[[], None]]:
    bar = tqdm(total=total, unit="req", disable=quiet, file=sys.stderr, dynamic_ncols=True)

    def update(p: Progress) -> None:
        bar.n = p.completed + p.failed
        bar.set_postfix_str(f"sent={p.sent} ok={p.completed} failed={p.failed}", refresh=False)
        bar.refresh()

    return update, bar.close


def _ms(value: Any) -> str:
    return "-" if value is None else f"{float(value):.0f} ms"


def run_line(record: Mapping[str, Any]) -> str:
    """One human line per replay: attainment, latencies, failures and the client's own lag."""
    lag = record.get("send_lag_ms") or {}
    pct = {
        k: 100 * float(record[k]) for k in ("slo_attainment", "ttft_attainment", "tpot_attainment")
    }
    line = (
        f"{record['policy']} @ {record['rps']:g} req/s: SLO {pct['slo_attainment']:.1f} %"
        f" (TTFT {pct['ttft_attainment']:.1f} %, TPOT {pct['tpot_attainment']:.1f}"
        f" %); {record['completed']} completed, {record['failed']} failed;"
        f" TTFT median {_ms(record.get('median_ttft_ms'))} p99 {_ms(record.get('p99_ttft_ms'))};"
        f" TPOT median {_ms(record.get('median_tpot_ms'))} p99 {_ms(record.get('p99_tpot_ms'))};"
        f" send lag p99 {lag.get('p99', '-')} ms"
    )
    errors = record.get("errors") or {}
    if errors:
        top = "; ".join(f"{n}x {msg}" for msg, n in list(errors.items())[:5])
        line += f"\n  errors: {top}"
    if record.get("short_outputs"):
        line += (
            f"\n  note: {record['short_outputs']} completed requests returned fewer tokens than"
            " max_tokens (does the server honour ignore_eos?)"
        )
    return line


def run(args: argparse.Namespace) -> int:
    endpoint = normalize_endpoint(args.endpoint)
    label = _label(args.label)
    prompt_format = _prompt_format(args)
    # A FluidPD router's /admin/stats takes its admin token; sent as the API key it is
    # ignored on the OpenAI routes.
    api_key = (
        args.api_key
        or os.environ.get("OPENAI_API_KEY")
        or os.environ.get("FLUIDPD_ADMIN_TOKEN")
        or "none"
    )
    try:
        slo = SLO(args.ttft_slo, args.tpot_slo)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    workload = build_workload(
        args.workload,
        args.rps,
        seed=args.seed,
        context_limit=args.context_limit,
        num_requests=args.num_requests,
    )
    out_dir = Path(args.out)
    try:  # before the replay: a results file we cannot append to must not waste a run
        previous, previous_command = load_previous(out_dir)
    except ResultsFileError as exc:
        raise UserError(f"--out: {exc}") from None
    served = _served_model(args, endpoint, api_key)
    has_stats = fetch_admin_stats(endpoint, api_key) is not None
    command = "fluidpd " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    cfg = ReplayConfig(
        endpoint=endpoint,
        api=args.api,
        model=served,
        prompt_format="ids" if prompt_format == "ids" else "text",
        seed=args.seed,
        timeout_s=args.timeout,
        api_key=api_key,
        max_concurrency=args.max_concurrency,
        stats_interval_s=STATS_INTERVAL_S if has_stats else None,
    )
    if not args.quiet:
        span = float(workload.arrivals[-1])
        print(
            f"replaying {len(workload)} requests ({args.workload}, {args.rps:g} req/s, "
            f"{span:.0f} s) against {endpoint} model {served!r}"
            + (" with /admin/stats" if has_stats else ""),
            file=sys.stderr,
        )
    update, close = _progress_bar(len(workload), args.quiet)
    try:
        result = replay(workload, cfg, update)
    finally:
        close()
    total = len(workload)
    if result.stopped is not None:
        if result.offered == 0:
            raise UserError(f"replay stopped ({result.stopped}) before any request was sent")
        # Measured over the requests whose send time came: the rest were never offered.
        workload = workload.head(result.offered)
        result.outcomes = result.outcomes[: result.offered]
    meta = ReplayMeta(
        label=label,
        rps=float(args.rps),
        workload=str(args.workload),
        model=str(args.model_name),
        gpu=str(args.gpu),
        pd=str(args.pd),
        slo=slo,
        seed=args.seed,
        endpoint=endpoint,
        served_model=served,
        api=args.api,
        prompt_format=prompt_format,
        timeout_s=args.timeout,
        max_concurrency=args.max_concurrency,
        command=command,
    )
    output, _ = build_output(meta, workload, result)
    if result.stopped is not None:
        output.record["interrupted"] = result.stopped
        output.record["not_sent"] = total - result.offered
    started = time.perf_counter()
    path = write_replay_results(out_dir, previous, previous_command, output)
    write_request_log(requests_path(out_dir, output.record), result.outcomes)
    records = [*previous, output.record]
    if not args.no_plots:
        _plots(out_dir, records, output.series, workload, args)
    print(run_line(output.record))
    table = report_text(out_dir, records)
    if any(r.get("policy") in POLICY_NAMES for r in records):
        print()
        print(table)
    kept = f", after {len(previous)} earlier" if previous else ""
    print(
        f"\nwrote {path} ({len(records)} run{'s' if len(records) > 1 else ''}{kept}; "
        f"replay {result.wall_s:.1f} s, write {time.perf_counter() - started:.1f} s)"
    )
    if output.record["completed"] == 0:
        print("fluidpd: warning: every request failed (see errors above)", file=sys.stderr)
    if result.stopped is not None:
        print(
            f"fluidpd: warning: replay stopped ({result.stopped}): measured over the "
            f"{result.offered} of {total} requests it offered",
            file=sys.stderr,
        )
        return 128 + result.stop_signal
    return 0


def _plots(
    out_dir: Path,
    records: list[dict[str, Any]],
    series: dict[str, Any],
    workload: Workload,
    args: argparse.Namespace,
) -> None:
    """Plots every run in the directory; earlier runs' time series are read back from disk so
    that e.g. the static and fluidpd replays share one time-series figure."""
    by_key: dict[tuple[str, float, str], Mapping[str, Any]] = {}
    for r in records[:-1]:
        saved = load_series(out_dir, r)
        if saved:
            by_key[series_key(r)] = saved
    by_key[series_key(records[-1])] = series
    # matplotlib costs about 0.4 s of CPU to import; every `fluidpd` process (each sidecar, router
    # and controller) imports this module, and only a run that plots needs it.
    from fluidpd.sim.plots import window_edges, write_plots

    edges = {str(args.workload): window_edges(workload)}
    rates = {str(args.workload): float(args.rps)}
    for written in write_plots(out_dir, records, by_key, args.ttft_slo, edges, rates):
        print(f"plot: {written}")
