"""What the SGLang GPU scripts share (``scripts/gpu/sglang_stack.py``), checked on CPU: the
command lines they build, the processes they start and stop, the client that collects their
results (against a stand-in HTTP server), and the pure helpers of the scripts themselves."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

GPU = Path(__file__).resolve().parents[2] / "scripts" / "gpu"
sys.path.insert(0, str(GPU))

import sglang_split  # noqa: E402
import sglang_stack as st  # noqa: E402
import sglang_switch  # noqa: E402


def _args(*argv: str, **defaults: Any) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    st.add_stack_args(p, **{"work": "/tmp/w", "start_timeout": 300.0, **defaults})
    return p.parse_args(["--out", "o", *argv])


def test_common_flags_and_their_defaults() -> None:
    a = _args()
    assert (a.work, a.python, a.shape, a.model_dir, a.device, a.start_timeout) == (
        Path("/tmp/w"), "python3", "llama-3.1-8b", None, "cuda:0", 300.0
    )  # fmt: skip
    b = _args("--device", "cpu", python="py", device="cuda", start_timeout=420.0)
    assert (b.python, b.device, b.start_timeout) == ("py", "cpu", 420.0)


def test_sidecar_flags_end_with_dummy_weights_unless_a_model_dir() -> None:
    a = _args("--python", "/sgl/python", "--start-timeout", "240")
    assert st.sidecar_args(a, Path("/m"), "--no-fluidtoken") == [
        "--engine", "sglang", "--device", "cuda:0", "--model-dir", "/m",
        "--sglang-python", "/sgl/python", "--sglang-start-timeout", "240.0",
        "--no-fluidtoken", "--sglang-load-format", "dummy",
    ]  # fmt: skip
    real = _args("--model-dir", "/real")
    assert st.sidecar_args(real, Path("/real"))[-2:] == ["--sglang-start-timeout", "300.0"]


def test_sidecar_and_router_command_lines() -> None:
    p, d = st.Worker("p0", "prefill", 9001), st.Worker("d0", "decode", 9002)
    assert st.sidecar_argv(p, ["--x"], ["--y"]) == [
        *st.FLUIDPD, "sidecar", "--id", "p0", "--role", "prefill", "--port", "9001", "--x", "--y"
    ]  # fmt: skip
    assert st.router_argv(9000, Path("/m"), [p, d], ["--log-level", "warning"]) == [
        *st.FLUIDPD, "router", "--port", "9000", "--model-dir", "/m", "--log-level", "warning",
        "--worker", "p0=http://127.0.0.1:9001", "--worker", "d0=http://127.0.0.1:9002",
    ]  # fmt: skip


def test_random_prompts_are_the_seeds_and_clear_of_the_vocabulary_ends() -> None:
    a, b = random.Random(7), random.Random(7)
    ids = st.random_ids(a, 500, 64)
    assert ids == [b.randrange(10, 54) for _ in range(500)]
    assert min(ids) >= 10 and max(ids) < 54


def test_model_dir_given_is_used_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 321}))
    a = _args("--model-dir", str(tmp_path))
    assert st.model_dir(a, tmp_path / "unused") == tmp_path
    assert st.vocab_size(tmp_path) == 321
    assert not (tmp_path / "unused").exists()


def test_stack_without_token_sets_none_and_stop_ends_the_session(tmp_path: Path) -> None:
    probe = "import os; print(os.environ.get('FLUIDPD_ADMIN_TOKEN'), os.environ['FLUIDPD_LOG_DIR'])"
    stack = st.Stack(tmp_path, None)
    assert stack.headers == {}
    stack.start("probe", [sys.executable, "-c", probe])
    stack.procs["probe"].wait(60)
    assert (tmp_path / "probe.out").read_text().split() == ["None", str(tmp_path)]
    with_token = st.Stack(tmp_path, "t0k")
    assert with_token.headers == {"Authorization": "Bearer t0k"}
    with_token.start("probe2", [sys.executable, "-c", probe])
    with_token.procs["probe2"].wait(60)
    assert (tmp_path / "probe2.out").read_text().split()[0] == "t0k"
    # A process whose child outlives it: stopping the session ends the child too.
    child = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "print('up', flush=True); time.sleep(600)"
    )
    stack.start("tree", [sys.executable, "-c", child])
    proc = stack.procs["tree"]
    while "up" not in (tmp_path / "tree.out").read_text():
        assert proc.poll() is None
        time.sleep(0.05)
    stack.stop("tree")
    assert "tree" not in stack.procs and proc.returncode is not None
    for _ in range(100):  # the orphaned child is reaped by init soon after its SIGTERM
        alive = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, check=False)
        if not alive.stdout:
            break
        time.sleep(0.1)
    assert alive.stdout == b""


def test_write_json_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "rep.json"
    st.write_json(path, {"a": 1})
    st.write_json(path, {"b": [1, 2]})
    assert json.loads(path.read_text()) == {"b": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["rep.json"]


def test_pct_interpolates_like_numpy() -> None:
    assert st.pct([], 0.5) is None
    assert st.pct([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5
    assert st.pct([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == pytest.approx(4.6)


def _sse(*events: dict[str, Any]) -> bytes:
    lines = [f"data: {json.dumps(e)}\n\n" for e in events]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


def _serve(handler: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def test_complete_collects_text_first_token_and_usage() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(req.content))
        if bodies[-1]["prompt"] == [[9]]:
            return httpx.Response(503, content=b"no worker")
        events: list[dict[str, Any]] = [
            {"choices": [{"text": "he"}]},
            {"choices": [{"text": ""}]},
            {"choices": [{"text": "llo"}]},
            {"choices": [], "usage": {"completion_tokens": 4}},
        ]
        return httpx.Response(200, content=_sse(*events))

    async def go() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], float]:
        async with _serve(handler) as c:
            one = await st.complete(c, "http://r", "m", [1, 2], 4, ignore_eos=False)
            bad = await st.complete(c, "http://r", "m", [9], 4)
            res, wall = await st.timed_load(c, "http://r", "m", [[5], [6], [7]], 4, conc=2)
        return one, bad, res, wall

    one, bad, res, wall = asyncio.run(go())
    assert (one["text"], one["tokens"], one["error"]) == ("hello", 4, None)
    assert one["ttft_s"] is not None and one["wall_s"] >= one["ttft_s"]
    assert bodies[0]["ignore_eos"] is False and bodies[0]["stream"] is True
    assert bad["error"].startswith("HTTP 503") and bad["tokens"] == 0
    assert [r["text"] for r in res] == ["hello"] * 3 and wall > 0
    assert [b["prompt"] for b in bodies[2:]] == [[[5]], [[6]], [[7]]]
    assert all(b["ignore_eos"] is True for b in bodies[1:])


def test_generate_bodies_and_a_refusal() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(req.content))
        if bodies[-1]["input_ids"] == [0]:
            return httpx.Response(400, content=b"bad ids")
        return httpx.Response(200, json={"output_ids": [3, 4]})

    async def go() -> dict[str, Any]:
        async with _serve(handler) as c:
            out = await sglang_split.generate(c, "http://s", [1, 2], 2, {"rid": "7"})
            await st.generate(c, "http://s", [1], 5, ignore_eos=False)
            with pytest.raises(RuntimeError, match="400 bad ids"):
                await st.generate(c, "http://s", [0], 1)
            return out

    out = asyncio.run(go())
    assert out["output_ids"] == [3, 4] and out["wall_s"] >= 0
    assert bodies[0] == {
        "input_ids": [1, 2],
        "sampling_params": {"max_new_tokens": 2, "temperature": 0.0, "ignore_eos": True},
        "return_logprob": True, "top_logprobs_num": 2, "rid": "7",
    }  # fmt: skip
    assert bodies[1] == {
        "input_ids": [1],
        "sampling_params": {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": False},
    }


def test_split_and_switch_helpers() -> None:
    assert [sglang_split.prefix_len(b, 10) for b in sglang_split.BETAS] == [10, 9, 5, 1, 0]
    assert sglang_split.divergence([1, 2, 3], [1, 2, 3]) is None
    assert sglang_split.divergence([1, 5, 3], [1, 2, 3]) == 1
    assert sglang_split.divergence([1, 2], [1, 2, 3]) == 2
    assert sglang_switch._agree("abcx", "abcd") == 0.75
    assert sglang_switch._agree("", "") == 0.0
