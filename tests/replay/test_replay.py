"""``fluidpd replay`` against a small real OpenAI-compatible server started inside the test.

The server (FastAPI + uvicorn on 127.0.0.1, in a background thread) streams deterministic tokens
after a controllable delay and fails (HTTP 500) or stalls requests picked by their prompt length,
which the tests control through a trace CSV. Server and client share one process, so the server's
``perf_counter`` receive times are comparable with the client's schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from fastapi import FastAPI, HTTPException, Request  # noqa: E402
from fastapi.responses import JSONResponse, StreamingResponse  # noqa: E402

from fluidpd.cli import replay_cmd  # noqa: E402
from fluidpd.cli.errors import UserError  # noqa: E402
from fluidpd.cli.main import _Parser  # noqa: E402
from fluidpd.replay.client import _on_stop_signals  # noqa: E402
from fluidpd.replay.prompts import prompt_ids  # noqa: E402
from fluidpd.replay.results import requests_path, series_path  # noqa: E402
from fluidpd.sim.workloads import WorkloadError  # noqa: E402

MODEL_ID = "fake-model"
STALL = 7  # prompt length of a request the server never answers
FAIL = 13  # prompt length of a request the server answers with HTTP 500
STALL_MID = 19  # ... one that sends one token and then goes silent
ABORT_MID = 23  # ... one that sends one token and then an error object in the stream


# -- the fake server --------------------------------------------------------------------------
@dataclass
class Seen:
    t: float  # perf_counter when the handler started
    path: str
    body: dict[str, Any]


@dataclass
class FakeServer:
    port: int = 0
    ttft_s: float = 0.2
    itl_s: float = 0.01
    usage: bool = True
    admin: bool = False
    stats: dict[str, Any] = field(default_factory=dict)
    stolen_per_request: int = 0
    switch_on_request: int | None = None  # add a role switch when this many requests arrived
    seen: list[Seen] = field(default_factory=list)
    disconnected: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        self.ttft_s, self.itl_s, self.usage, self.admin = 0.2, 0.01, True, False
        self.stolen_per_request, self.switch_on_request = 0, None
        self.stats = {"role_switches": [], "stolen_tokens": 0, "workers": []}
        self.seen.clear()
        self.disconnected = 0

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}

        @app.get("/admin/stats")
        async def admin_stats() -> dict[str, Any]:
            if not self.admin:
                raise HTTPException(404)
            return self.stats

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            return await self.handle(request, chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            return await self.handle(request, chat=True)

        return app

    async def handle(self, request: Request, chat: bool) -> Any:
        t = time.perf_counter()
        body = await request.json()
        self.seen.append(Seen(t, request.url.path, body))
        self.stats["stolen_tokens"] += self.stolen_per_request
        if self.switch_on_request == len(self.seen):
            self.stats["role_switches"].append(
                {"t": 1.5, "worker": "w3", "from": "decode", "to": "prefill", "drain_s": 0.4}
            )
        if chat:
            prompt_len = len(body["messages"][0]["content"].split())
        elif isinstance(body["prompt"], list):
            prompt_len = len(body["prompt"])
        else:
            prompt_len = len(body["prompt"].split())
        if prompt_len == FAIL:
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        return StreamingResponse(
            self.stream(body, chat, prompt_len), media_type="text/event-stream"
        )

    async def wedge(self) -> None:
        """Never answer (until the test ends), like a wedged engine."""
        while not self.stop.is_set():
            await asyncio.sleep(0.05)

    async def stream(self, body: dict[str, Any], chat: bool, prompt_len: int) -> AsyncIterator[str]:
        try:
            if prompt_len == STALL:
                await self.wedge()
                return
            await asyncio.sleep(self.ttft_s)
            n = int(body["max_tokens"])
            for i in range(n):
                if i == 1 and prompt_len == STALL_MID:
                    await self.wedge()
                    return
                if i == 1 and prompt_len == ABORT_MID:
                    yield 'data: {"error": {"message": "aborted by the engine"}}\n\n'
                    return
                if i:
                    await asyncio.sleep(self.itl_s)
                text = f" tok{i}"
                choice = (
                    {"index": 0, "delta": {"content": text}, "finish_reason": None}
                    if chat
                    else {"index": 0, "text": text, "finish_reason": None}
                )
                yield f"data: {json.dumps({'choices': [choice], 'usage': None})}\n\n"
            if self.usage and body.get("stream_options", {}).get("include_usage"):
                usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        except asyncio.CancelledError:  # the client went away
            self.disconnected += 1
            raise


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    fake.reset()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    fake.port = sock.getsockname()[1]
    config = uvicorn.Config(
        fake.app(), log_level="error", lifespan="off", timeout_graceful_shutdown=1
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.01)
    yield fake
    fake.stop.set()
    srv.should_exit = True
    thread.join(timeout=5)
    sock.close()


@pytest.fixture
def fake(server: FakeServer) -> FakeServer:
    server.reset()
    return server


# -- helpers ----------------------------------------------------------------------------------
def write_trace(path: Path, rows: Sequence[tuple[float, int, int]]) -> Path:
    """An Azure-format CSV: (seconds offset, prompt tokens, output tokens) per row."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t, p, o in rows:
        whole, frac = divmod(round(t * 1e6), 1_000_000)
        lines.append(f"2023-11-16 18:{whole // 60:02d}:{whole % 60:02d}.{frac:06d},{p},{o}")
    path.write_text("\n".join(lines) + "\n")
    return path


def rate(rows: Sequence[tuple[float, int, int]]) -> str:
    """The --rps that keeps a trace's native gaps (the CSV workload scales to (n-1)/span)."""
    return repr((len(rows) - 1) / (rows[-1][0] - rows[0][0]))


def replay(*argv: str) -> int:
    """``fluidpd replay ARGV`` in-process, with the top-level command's error handling."""
    parser = _Parser(prog="fluidpd")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    replay_cmd.add_parser(sub)
    try:
        args: argparse.Namespace = parser.parse_args(["replay", *argv])
        code: int = args.func(args)
    except (UserError, WorkloadError) as exc:
        print(f"fluidpd: error: {exc}", file=sys.stderr)
        return 2
    return code


def run_replay(fake: FakeServer, out: Path, trace: Path, rps: str, *extra: str) -> dict[str, Any]:
    code = replay(
        "--endpoint", fake.url, "--workload", str(trace), "--rps", rps, "--out", str(out),
        "--quiet", *extra,
    )  # fmt: skip
    assert code == 0
    runs: list[dict[str, Any]] = json.loads((out / "results.json").read_text())["runs"]
    return runs[-1]


# -- tests ------------------------------------------------------------------------------------
ROWS = [(0.1 * i, p, o) for i, (p, o) in enumerate([(5, 10), (17, 20), (33, 5), (8, 1), (64, 15)])]


def test_ttft_tpot_lengths_and_request_body(fake: FakeServer, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", ROWS)
    rec = run_replay(fake, tmp_path / "out", trace, rate(ROWS), "--no-plots", "--seed", "3")
    assert rec["completed"] == 5 and rec["failed"] == 0 and rec["errors"] == {}
    # Server: 0.2 s to the first token, 0.01 s per token after it (loose bounds: shared CI).
    assert 180 <= rec["mean_ttft_ms"] <= 700, rec["mean_ttft_ms"]
    # TTFT stops at the first token: it is well short of the whole request.
    assert rec["mean_ttft_ms"] < rec["mean_e2e_latency_ms"] - 50
    assert 8 <= rec["median_tpot_ms"] <= 30, rec["median_tpot_ms"]
    assert rec["total_output_tokens"] == sum(o for _, _, o in ROWS)
    assert rec["total_input_tokens"] == sum(p for _, p, _ in ROWS)
    assert rec["slo_attainment"] == 1.0 and rec["short_outputs"] == 0
    bodies = sorted(fake.seen, key=lambda s: s.t)
    assert [s.path for s in bodies] == ["/v1/completions"] * 5
    for i, (s, (_, p, o)) in enumerate(zip(bodies, ROWS, strict=True)):
        assert s.body["max_tokens"] == o
        assert s.body["prompt"] == prompt_ids(3, i, p)  # exact length, deterministic ids
        assert s.body["model"] == MODEL_ID  # the first id of GET /v1/models
        assert s.body["stream"] is True and s.body["ignore_eos"] is True
        assert s.body["stream_options"] == {"include_usage": True}
    for key in ("policy", "rps", "workload", "model", "gpu", "pd", "ttft_slo", "tpot_slo"):
        assert key in rec
    assert rec["policy"] == "replay" and rec["model"] == "unknown"
    assert rec["role_switches"] == [] and rec["stolen_tokens"] == 0  # no /admin/stats
    assert rec["endpoint"] == fake.url and rec["window_attainment"] == {"all": 1.0}
    # The per-request log: one row per request in workload order, whose TTFTs are the run's.
    rows = [json.loads(x) for x in requests_path(tmp_path / "out", rec).read_text().splitlines()]
    assert [r["i"] for r in rows] == list(range(5))
    assert [(r["prompt_len"], r["output_tokens"]) for r in rows] == [(p, o) for _, p, o in ROWS]
    assert statistics.mean(r["ttft_ms"] for r in rows) == pytest.approx(
        rec["mean_ttft_ms"], abs=0.01
    )
    assert all(r["error"] is None and r["e2e_ms"] >= r["ttft_ms"] for r in rows)
    assert rows[3]["tpot_ms"] is None  # one output token: no TPOT


def test_open_loop_sends_on_schedule(fake: FakeServer, tmp_path: Path) -> None:
    """Ten requests 50 ms apart that each take 2 s to a first token: an open loop has sent all
    of them before the first answers; a closed loop would send one every 2 s (20 s in all)."""
    fake.ttft_s = 2.0
    rows = [(0.05 * i, 10, 5) for i in range(10)]
    trace = write_trace(tmp_path / "t.csv", rows)
    rec = run_replay(fake, tmp_path / "out", trace, rate(rows), "--no-plots")
    assert rec["completed"] == 10
    t = sorted(s.t for s in fake.seen)
    # Ordinal, not a stopwatch: the last send happens before the first reply could exist.
    assert t[-1] - t[0] < fake.ttft_s, t
    assert rec["wall_s"] < 10 * fake.ttft_s / 2
    assert rec["send_lag_ms"]["max"] >= 0


def test_stall_times_out_and_500_is_counted(fake: FakeServer, tmp_path: Path) -> None:
    rows = [
        (0.0, 5, 4), (0.05, STALL, 4), (0.1, FAIL, 4), (0.15, 9, 4), (0.2, STALL_MID, 4),
        (0.25, ABORT_MID, 4),
    ]  # fmt: skip
    trace = write_trace(tmp_path / "t.csv", rows)
    started = time.perf_counter()
    rec = run_replay(fake, tmp_path / "out", trace, rate(rows), "--no-plots", "--timeout", "2.0")
    # A 0.6 s limit timed out the 0.2 s-TTFT requests too when the host was loaded (send lag
    # p99 0.49 s in CI-like load): 2 s keeps them clear of it.
    assert time.perf_counter() - started < 10  # the stalled streams did not hold the replay
    assert rec["completed"] == 2 and rec["failed"] == 4
    assert rec["errors"] == {
        "timeout: no first token within 2 s": 1,
        "HTTP 500: boom": 1,
        "stream stalled: no data for 2 s": 1,  # silent after its first token
        "stream error: aborted by the engine": 1,
    }
    assert rec["slo_attainment"] == pytest.approx(2 / 6, abs=1e-6)
    logged = [json.loads(x) for x in requests_path(tmp_path / "out", rec).read_text().splitlines()]
    assert [r["error"] is None for r in logged] == [True, False, False, True, False, False]
    assert logged[1]["ttft_ms"] is None and logged[1]["error"].startswith("timeout")
    assert logged[4]["ttft_ms"] is not None and logged[4]["e2e_ms"] is None  # stalled mid-way
    deadline = time.monotonic() + 2
    while fake.disconnected < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.disconnected == 2  # both stalled requests were cancelled on the server


def test_chat_text_prompts_and_chunk_counting(fake: FakeServer, tmp_path: Path) -> None:
    fake.usage = False  # output length must come from the non-empty chunks
    trace = write_trace(tmp_path / "t.csv", ROWS)
    rec = run_replay(
        fake, tmp_path / "out", trace, rate(ROWS), "--no-plots", "--api", "chat",
        "--served-model", "other",
    )  # fmt: skip
    assert rec["completed"] == 5 and rec["api"] == "chat" and rec["prompt_format"] == "text"
    assert rec["total_output_tokens"] == sum(o for _, _, o in ROWS)
    for s, (_, p, o) in zip(sorted(fake.seen, key=lambda s: s.t), ROWS, strict=True):
        assert s.path == "/v1/chat/completions" and s.body["model"] == "other"
        assert len(s.body["messages"][0]["content"].split()) == p
        assert s.body["max_tokens"] == o


def test_max_concurrency_limits_streams(fake: FakeServer, tmp_path: Path) -> None:
    fake.ttft_s = 0.2
    rows = [(0.0, 10, 2), (0.001, 11, 2), (0.002, 12, 2)]
    trace = write_trace(tmp_path / "t.csv", rows)
    rec = run_replay(
        fake, tmp_path / "out", trace, rate(rows), "--no-plots", "--max-concurrency", "1"
    )
    assert rec["completed"] == 3 and rec["max_concurrency"] == 1
    t = sorted(s.t for s in fake.seen)
    assert t[1] - t[0] > 0.18 and t[2] - t[1] > 0.18  # one at a time
    assert rec["median_ttft_ms"] > 350  # the slot wait counts from the scheduled send time


def test_results_append_admin_stats_and_plots(fake: FakeServer, tmp_path: Path) -> None:
    rows = [(0.12 * i, 20, 4) for i in range(12)]  # ~1.4 s: at least two stats samples
    trace = write_trace(tmp_path / "t.csv", rows)
    out = tmp_path / "out"
    first = run_replay(fake, out, trace, rate(rows), "--label", "static", "--pd", "4P4D")
    assert first["admin_stats"] is False

    old = {"t": 0.1, "worker": "w0", "from": "prefill", "to": "decode", "drain_s": 1.0}
    fake.admin = True
    fake.stats = {
        "role_switches": [old],
        "stolen_tokens": 1000,
        "workers": [
            {"worker": "w0", "role": "prefill", "state": "active", "queue_len": 3},
            {"worker": "w1", "role": "prefill", "state": "active", "queue_len": 2},
            {"worker": "w2", "role": "decode", "state": "active", "queue_len": 0},
        ],
    }
    fake.stolen_per_request = 50
    fake.switch_on_request = len(fake.seen) + 4  # during the second replay
    second = run_replay(
        fake, out, trace, rate(rows), "--label", "fluidpd", "--model-name", "llama-3.1-8b"
    )
    doc = json.loads((out / "results.json").read_text())
    assert [r["policy"] for r in doc["runs"]] == ["static", "fluidpd"]
    assert second["admin_stats"] is True and second["model"] == "llama-3.1-8b"
    # Only this replay's switch and stolen tokens, not the router's history.
    assert [s["worker"] for s in second["role_switches"]] == ["w3"]
    assert second["stolen_tokens"] == 50 * len(rows)
    series = json.loads(series_path(out, second).read_text())
    assert len(series["t"]) >= 2 and set(series["n_prefill"]) == {2}
    assert set(series["prefill_queue"]) == {5} and set(series["n_decode"]) == {1}
    assert sum(series["stolen_tokens"]) <= 50 * len(rows) and series["ppi_bar"][0] == 0.0
    assert series["p95_ttft"] and series["p95_ttft_t"][0] == 0.0
    assert series_path(out, first).exists()  # the earlier run's series is kept
    for name in ("attainment_vs_rps.png", f"timeseries_t_{float(rate(rows)):g}.png"):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "ablation.png").exists()  # two labels are not the component ablation
    assert len((out / "command.txt").read_text().splitlines()) == 2


def test_option_and_endpoint_errors(
    fake: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "t.csv", ROWS)
    out = tmp_path / "out"
    base = ("--workload", str(trace), "--out", str(out), "--quiet")
    cases = [
        (("--endpoint", fake.url, "--api", "chat", "--prompt-format", "ids"), "--prompt-format"),
        (("--endpoint", fake.url, "--rps", "0"), "--rps"),
        (("--endpoint", "ftp://x"), "--endpoint"),
        (("--endpoint", fake.url, "--seed", "-1"), "--seed"),
        (("--endpoint", fake.url, "--label", ""), "--label"),
        (("--endpoint", fake.url, "--api", "grpc"), "--api"),
    ]
    for argv, option in cases:
        assert replay(*base, *argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert option in err and len(err.splitlines()) == 1, err
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert replay(*base, "--endpoint", dead) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fluidpd: error: cannot reach {dead}") and "\n" not in err
    assert not out.exists() and not fake.seen  # stopped before anything was sent or written
    out.mkdir()
    (out / "results.json").write_text("not json")
    assert replay(*base, "--endpoint", fake.url) == 2
    assert "--out" in capsys.readouterr().err


def test_no_openai_client_needed() -> None:
    code = (
        "import sys, fluidpd.cli.replay_cmd, fluidpd.replay.client; "
        "sys.exit('openai' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_stop_signal_keeps_what_the_replay_measured(fake: FakeServer, tmp_path: Path) -> None:
    """SIGTERM (``timeout``, a job's time limit) part-way: the replay sends nothing more, fails
    the streams in flight as interrupted, and writes results over the requests it offered, with
    the stop recorded, and exits 128 + 15."""
    rows = [(0.4 * i, STALL if i == 2 else 9, 3) for i in range(12)]
    trace = write_trace(tmp_path / "t.csv", rows)
    out = tmp_path / "out"
    argv = [
        sys.executable, "-m", "fluidpd.cli.main", "replay", "--endpoint", fake.url,
        "--workload", str(trace), "--rps", rate(rows), "--out", str(out), "--quiet",
        "--no-plots", "--timeout", "60",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(fake.seen) < 4:  # the stalled request is in flight from here on
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.terminate()
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + 15, stderr
    assert "replay stopped (SIGTERM at" in stderr and "Traceback" not in stderr
    assert f"wrote {out / 'results.json'}" in stdout
    rec = json.loads((out / "results.json").read_text())["runs"][-1]
    offered = rec["num_requests"]
    assert rec["interrupted"].startswith("SIGTERM at ")
    assert 4 <= offered < len(rows) and rec["not_sent"] == len(rows) - offered
    assert rec["completed"] + rec["failed"] == offered
    # The stalled stream (and any sent a moment before the stop) failed as interrupted;
    # nothing else failed, and nothing past the offered prefix was sent.
    assert set(rec["errors"]) == {f"interrupted: the replay was stopped ({rec['interrupted']})"}
    assert 1 <= rec["failed"] <= 2 and len(fake.seen) <= offered
    deadline = time.monotonic() + 5
    while fake.disconnected < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.disconnected >= 1  # the stalled stream's connection was closed


def test_stop_signals_are_taken_only_where_the_loop_can_take_them() -> None:
    """On the main thread SIGTERM and SIGINT are routed to the stop; off it (a replay run from a
    worker thread) none is installed and the signals keep their default, without an error."""

    def install() -> list[signal.Signals]:
        loop = asyncio.new_event_loop()
        try:
            handled = _on_stop_signals(loop, lambda sig: None)
            for sig in handled:
                loop.remove_signal_handler(sig)
            return handled
        finally:
            loop.close()

    assert install() == [signal.SIGTERM, signal.SIGINT]
    off_main: list[list[signal.Signals]] = []
    worker = threading.Thread(target=lambda: off_main.append(install()))
    worker.start()
    worker.join()
    assert off_main == [[]]
