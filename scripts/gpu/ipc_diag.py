"""Helpers of ``scripts/gpu/ipc_diag.sh`` (the live 2P2D cuda-ipc vs shm diagnosis, 2026-12-03).

``probe``      sequential requests with fixed prompts through the router (one at a time, so each
               decodes alone): every streamed chunk with its time; the decode trace logs the ids.
``poll``       GET /pressure of every sidecar every ``--every`` s until killed (JSON lines).
``fetch``      the router's and the sidecars' /metrics, into the run directory.
``summarize``  one run directory: the decode traces (``FLUIDPD_DEBUG_LOGGERS=fluidpd.trace``), the
               router's and sidecars' TTFT histograms (first token *ids*) next to the replay's
               client TTFT (first non-empty *text*), the pressure samples.
``compare``    the summaries of several runs side by side, and the probe outputs across runs.
``traces``     the replay requests' decode traces per run, and equal ids across runs of a tree.

stdlib only (urllib), so it runs wherever the checkout does.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fluidpd.replay.prompts import prompt_ids

PROBE_LENS = (64, 500, 2000, 6000)
PROBE_TOKENS = 32


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def probe(args: argparse.Namespace) -> None:
    models = json.loads(_get(f"{args.endpoint}/v1/models"))
    model = models["data"][0]["id"]
    out = []
    for i, n in enumerate(PROBE_LENS):
        body = {
            "model": model, "prompt": prompt_ids(7, i, n), "max_tokens": PROBE_TOKENS,
            "temperature": 0.0, "stream": True, "ignore_eos": True,
        }  # fmt: skip
        req = urllib.request.Request(
            f"{args.endpoint}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        t0 = time.perf_counter()
        chunks: list[list[Any]] = []
        error = None
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                for raw in resp:
                    line = raw.strip()
                    if not line.startswith(b"data:") or line == b"data: [DONE]":
                        continue
                    obj = json.loads(line[5:])
                    for c in obj.get("choices") or []:
                        chunks.append([round(time.perf_counter() - t0, 4), c.get("text", "")])
        except Exception as exc:  # a refused probe is reported, the others still run
            error = str(exc)[:200]
        first_text = next((t for t, text in chunks if text), None)
        out.append({"prompt_len": n, "chunks": chunks, "first_text_s": first_text, "error": error,
                    "e2e_s": round(time.perf_counter() - t0, 4)})  # fmt: skip
        print(f"probe {n}: first text {first_text} s, {len(chunks)} chunks", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


def poll(args: argparse.Namespace) -> None:
    ports = [int(p) for p in args.ports.split(",")]
    with open(args.out, "a") as f:
        while True:
            t = time.time()
            for port in ports:
                try:
                    rec = json.loads(_get(f"http://127.0.0.1:{port}/pressure", timeout=1.0))
                except Exception as exc:
                    rec = {"error": str(exc)[:100]}
                rec["port"], rec["poll_t"] = port, t
                f.write(json.dumps(rec) + "\n")
            f.flush()
            time.sleep(max(0.0, args.every - (time.time() - t)))


def fetch(args: argparse.Namespace) -> None:
    """The router's and the sidecars' Prometheus text, into the run directory."""
    run = Path(args.run_dir)
    (run / "router-metrics.txt").write_bytes(_get(f"http://127.0.0.1:{args.router}/metrics"))
    parts = []
    for port in args.ports.split(","):
        try:
            parts.append(_get(f"http://127.0.0.1:{port}/metrics"))
        except Exception as exc:
            parts.append(f"# {port}: {exc}\n".encode())
    (run / "sidecar-metrics.txt").write_bytes(b"".join(parts))


def _hist_mean(text: str, name: str) -> tuple[float, int]:
    """Sum / count of a Prometheus histogram (all label sets together)."""
    s = sum(float(m) for m in re.findall(rf"^{name}_sum(?:{{[^}}]*}})? (\S+)$", text, re.M))
    c = sum(float(m) for m in re.findall(rf"^{name}_count(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return (s / c if c else float("nan")), int(c)


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def summarize(args: argparse.Namespace) -> dict[str, Any]:
    run = Path(args.run_dir)
    traces = []
    for log in sorted(run.glob("w*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "decode trace " in line:
                traces.append(json.loads(line.split("decode trace ", 1)[1]))
    s: dict[str, Any] = {"run": run.name, "traces": len(traces)}
    if traces:
        ok = [r for r in traces if r["first_token_t"]]
        s["first_output_id_has_text"] = sum(r["first_text_idx"] == 0 for r in traces) / len(traces)
        s["no_text_at_all"] = sum(r["first_text_idx"] < 0 for r in traces) / len(traces)
        s["text_tokens_share"] = sum(r["text_tokens"] for r in traces) / max(
            1, sum(r["out"] for r in traces)
        )
        s["first_text_idx_mean"] = _mean([r["first_text_idx"] for r in traces
                                          if r["first_text_idx"] >= 0])  # fmt: skip
        s["sidecar_first_token_s_mean"] = _mean([r["first_token_t"] - r["arrival"] for r in ok])
        s["sidecar_first_text_s_mean"] = _mean(
            [(r["first_text_t"] or r["finish_t"]) - r["arrival"] for r in traces]
        )
        s["e2e_s_mean"] = _mean([r["finish_t"] - r["arrival"] for r in traces])
        ids = [i for r in traces for i in r["ids"]]
        s["ids_below_1024_share_first16"] = sum(i < 1024 for i in ids) / max(1, len(ids))
    for name, file, metric in (
        ("router_ttft_ids", "router-metrics.txt", "fluidpd_router_ttft_seconds"),
        ("sidecar_ttft_ids", "sidecar-metrics.txt", "fluidpd_ttft_seconds"),
    ):
        p = run / file
        if p.exists():
            mean, count = _hist_mean(p.read_text(), metric)
            s[f"{name}_mean_s"], s[f"{name}_count"] = mean, count
    res = run / "replay" / "results.json"
    if res.exists():
        r = json.loads(res.read_text())["runs"][0]
        for k in ("policy", "slo_attainment", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                  "mean_tpot_ms", "mean_e2e_latency_ms", "p99_e2e_latency_ms", "completed",
                  "failed", "duration", "role_switches", "stolen_tokens"):  # fmt: skip
            s[k] = r.get(k)
    poll_file = run / "poll.jsonl"
    if poll_file.exists():
        per: dict[str, list[dict[str, Any]]] = {}
        for line in poll_file.read_text().splitlines():
            rec = json.loads(line)
            if "worker" in rec:
                per.setdefault(rec["worker"], []).append(rec)
        s["pressure"] = {
            w: {
                "role": recs[-1]["role"],
                "samples": len(recs),
                "batch_mean": _mean([r["batch"] for r in recs]),
                "batch_max": max(r["batch"] for r in recs),
                "queue_len_max": max(r["queue_len"] for r in recs),
                "kv_used_max": max(r["kv_used"] for r in recs),
                "kv_reserved_max": max(r["kv_reserved"] for r in recs),
            }
            for w, recs in sorted(per.items())
        }
    (run / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    print(json.dumps(s, indent=1))
    return s


def compare(args: argparse.Namespace) -> None:
    rows = []
    for d in args.run_dirs:
        p = Path(d) / "summary.json"
        if p.exists():
            rows.append(json.loads(p.read_text()))
    keys = ("slo_attainment", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
            "mean_e2e_latency_ms", "router_ttft_ids_mean_s", "first_output_id_has_text",
            "no_text_at_all", "text_tokens_share", "first_text_idx_mean")  # fmt: skip
    print("run".ljust(28) + "".join(k[:14].rjust(15) for k in keys))
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k)
            cells.append(f"{v:15.3f}" if isinstance(v, float) else f"{v!s:>15}")
        print(r["run"][:27].ljust(28) + "".join(cells))
    # The probe's requests decode alone: equal prompts, equal ids, whatever the transport.
    crcs = _probe_crcs()
    probes: dict[str, dict[str, list[int]]] = {}
    for d in args.run_dirs:
        for log in sorted(Path(d).glob("w*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if "decode trace " in line:
                    rec = json.loads(line.split("decode trace ", 1)[1])
                    if rec["crc"] in crcs:
                        probes.setdefault(rec["crc"], {})[Path(d).name] = rec["ids"]
    for crc, by_run in sorted(probes.items()):
        trees: dict[str, set[tuple[int, ...]]] = {}
        for run, ids in by_run.items():
            trees.setdefault(run.split("-", 1)[0], set()).add(tuple(ids))
        verdict = ", ".join(f"{t} {'equal' if len(v) == 1 else 'DIFFER'}" for t, v in trees.items())
        print(f"probe {crc}: {len(by_run)} runs, ids per tree {verdict}: "
              + "; ".join(f"{k}={v[:6]}" for k, v in by_run.items()))  # fmt: skip


def _probe_crcs() -> set[str]:
    return {
        f"{zlib.crc32(','.join(map(str, prompt_ids(7, i, n))).encode()):08x}"
        for i, n in enumerate(PROBE_LENS)
    }


def _replay_traces(run: Path) -> dict[str, dict[str, Any]]:
    """The decode traces of a run's replay requests (probes left out), by prompt crc."""
    probes = _probe_crcs()
    out = {}
    for log in sorted(run.glob("w*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "decode trace " in line:
                rec = json.loads(line.split("decode trace ", 1)[1])
                if rec["crc"] not in probes:
                    out[rec["crc"]] = rec
    return out


def traces(args: argparse.Namespace) -> None:
    """Per run, the replay's requests as their decode worker saw them: the first token's time
    (ids), the first text's time (what a client's TTFT is), the ids the tokenizer renders; then
    whether equal prompts produced equal ids in every run of one tree."""
    by_run = {Path(d).name: _replay_traces(Path(d)) for d in args.run_dirs}
    for name, recs in by_run.items():
        t = list(recs.values())
        if not t:
            continue
        n = len(t)
        first = _mean([r["first_token_t"] - r["arrival"] for r in t])
        text = _mean([(r["first_text_t"] or r["finish_t"]) - r["arrival"] for r in t])
        idx = [r["first_text_idx"] for r in t if r["first_text_idx"] >= 0]
        token0 = 100 * sum(r["first_text_idx"] == 0 for r in t) / n
        none = 100 * sum(r["first_text_idx"] < 0 for r in t) / n
        texty = 100 * sum(r["text_tokens"] for r in t) / sum(r["out"] for r in t)
        median = statistics.median(idx) if idx else -1
        print(
            f"{name}: {n} requests | first token (ids) {first:.3f} s | first text {text:.3f} s"
            f" | token 0 has text {token0:.1f} % | no text at all {none:.1f} %"
            f" | ids with text {texty:.2f} %"
            f" | first text at token {_mean(idx):.1f} (median {median})"
        )
    groups: dict[str, list[str]] = {}
    for name in by_run:
        groups.setdefault(name.split("-", 1)[0], []).append(name)
    for tree, names in groups.items():
        common = set.intersection(*(set(by_run[n]) for n in names))
        equal = sum(len({tuple(by_run[n][c]["ids"]) for n in names}) == 1 for c in common)
        print(
            f"{tree}: {len(names)} runs, {len(common)} prompts in all, 16 first ids equal: {equal}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--endpoint", default="http://127.0.0.1:8000")
    p.add_argument("--out", required=True)
    p = sub.add_parser("poll")
    p.add_argument("--ports", default="8101,8102,8103,8104")
    p.add_argument("--every", type=float, default=0.5)
    p.add_argument("--out", required=True)
    p = sub.add_parser("fetch")
    p.add_argument("run_dir")
    p.add_argument("--router", default="8000")
    p.add_argument("--ports", default="8101,8102,8103,8104")
    p = sub.add_parser("summarize")
    p.add_argument("run_dir")
    p = sub.add_parser("compare")
    p.add_argument("run_dirs", nargs="+")
    p = sub.add_parser("traces")
    p.add_argument("run_dirs", nargs="+")
    args = ap.parse_args()
    commands = {"probe": probe, "poll": poll, "fetch": fetch, "summarize": summarize}
    commands["compare"] = compare
    commands["traces"] = traces
    commands[args.cmd](args)


if __name__ == "__main__":
    main()
