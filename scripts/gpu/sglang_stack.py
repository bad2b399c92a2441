"""What the SGLang scripts on the H200 share (sglang_pd.py, sglang_split.py, sglang_switch.py,
sglang_overhead.py, sglang_live.py, sglang_bench.py): their common flags and model directory
(a dummy-weight shape or a real one), random prompts, processes started in their own session
and stopped with it, ``fluidpd sidecar --engine sglang`` workers, FluidPD's router (and
controller) and the plain SGLang P/D balancer (sglang_minilb.py) on the same SGLang servers;
an OpenAI streaming client that times TTFT and decode, SGLang's native ``/generate``; JSON
written whole; one log file for everything (the machine returns at most 8 files).

Memory on the one GPU: every worker starts at once with ``--mem-fraction F`` and a KV pool cap
(``--sglang-max-total-tokens``). SGLang 0.5.17 sizes its pool as (free memory after its own
weights load) - (free memory before) x (1 - F), then takes the smaller of that and the cap; with
F = 0.8 that stays above the cap whatever the other workers have allocated by then, as long as
the caps fit: n x (15 GB weights + cap x 128 KiB + ~3 GB activations and graphs) < 139 GiB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
FLUIDPD = [sys.executable, "-m", "fluidpd.cli.main"]


def add_stack_args(
    p: argparse.ArgumentParser,
    *,
    work: str,
    start_timeout: float,
    python: str = "python3",
    device: str = "cuda:0",
) -> None:
    """The flags every SGLang script takes, with that script's defaults."""
    p.add_argument("--out", required=True, help="directory of the results")
    p.add_argument("--work", type=Path, default=Path(work), help="scratch directory")
    p.add_argument("--python", default=python, help="SGLang's interpreter (a path)")
    p.add_argument("--shape", default="llama-3.1-8b", help="model shape (dummy weights)")
    p.add_argument("--model-dir", default=None, help="a real model directory (else --shape)")
    p.add_argument("--device", default=device)
    p.add_argument("--start-timeout", type=float, default=start_timeout,
                   help="seconds a server may take to start")  # fmt: skip


def make_model_dir(shape: str, out: Path) -> Path:
    """``config.json`` of the shape (weights: ``--load-format dummy``) and a synthetic tokenizer
    padded to the shape's vocabulary, so the directory is complete for FluidPD's sidecar too."""
    # Here, not at the top: a run on a real model directory needs neither.
    from fluidpd.modeldir.synthetic import write_tokenizer  # noqa: PLC0415
    from fluidpd_sidecar.gpu.config import resolve_shape  # noqa: PLC0415

    cfg = resolve_shape(shape)
    out.mkdir(parents=True, exist_ok=True)
    hf = cfg.to_hf_config()
    qwen = bool(getattr(cfg, "qk_norm", False))
    hf["architectures"] = ["Qwen3ForCausalLM" if qwen else "LlamaForCausalLM"]
    hf["model_type"] = "qwen3" if qwen else "llama"
    hf["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(hf, indent=1))
    # Padding ids decode to text: with dummy weights greedy decoding picks them most of the time.
    write_tokenizer(out, arch="llama", pad_to=int(hf["vocab_size"]), pad_special=False)
    # The sidecar reads EOS ids from generation_config.json (as serving the real model would).
    tok = json.loads((out / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    eos = [ids[t] for t in ("<|eot_id|>", "<|end_of_text|>") if t in ids]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out


def model_dir(args: argparse.Namespace, work: Path) -> Path:
    """``--model-dir``, or a directory of ``--shape`` made under ``work``."""
    return Path(args.model_dir) if args.model_dir else make_model_dir(args.shape, work)


def vocab_size(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["vocab_size"])


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    """A prompt of ``n`` random token ids, clear of the vocabulary's first and last ten."""
    return [rng.randrange(10, vocab - 10) for _ in range(n)]


def sidecar_args(args: argparse.Namespace, model: Path, *more: str) -> list[str]:
    """``fluidpd sidecar`` flags of an ``sglang`` worker: the engine, device, model and SGLang's
    interpreter and start limit, then ``more``, then dummy weights unless ``--model-dir``."""
    argv = [
        "--engine", "sglang", "--device", args.device, "--model-dir", str(model),
        "--sglang-python", args.python, "--sglang-start-timeout", str(args.start_timeout),
        *more,
    ]  # fmt: skip
    if not args.model_dir:
        argv += ["--sglang-load-format", "dummy"]
    return argv


def spawn(
    argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """A process in a session of its own (its SGLang children stop with it), output to ``log``."""
    return subprocess.Popen(
        argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True, cwd=cwd,
    )  # fmt: skip


def stop_procs(procs: Iterable[subprocess.Popen[bytes]], wait_s: float = 30.0) -> None:
    """SIGTERM to each process's session (also one whose leader has exited: its SGLang server
    may not have), then SIGKILL to those still there after ``wait_s``."""
    procs = list(procs)
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


@dataclass
class Worker:
    wid: str
    role: str
    port: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def sidecar_argv(w: Worker, common: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    return [*FLUIDPD, "sidecar", "--id", w.wid, "--role", w.role, "--port", str(w.port),
            *common, *extra]  # fmt: skip


def router_argv(
    port: int, model: Path, workers: Sequence[Worker], extra: Sequence[str] = ()
) -> list[str]:
    """FluidPD's router over ``workers`` (``extra``: more router flags)."""
    argv = [*FLUIDPD, "router", "--port", str(port), "--model-dir", str(model), *extra]
    for w in workers:
        argv += ["--worker", f"{w.wid}={w.url}"]
    return argv


@dataclass
class Stack:
    """Processes started in ``work`` (logs ``work/NAME.out``, FluidPD's logs under ``work``),
    with ``token`` as the admin token (None: none)."""

    work: Path
    token: str | None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        token = {"FLUIDPD_ADMIN_TOKEN": self.token} if self.token else {}
        full_env = {**os.environ, "FLUIDPD_LOG_DIR": str(self.work), **token, **(env or {})}
        print(f"[stack] start {name}: {' '.join(argv[2:])}", flush=True)
        self.procs[name] = spawn(argv, full_env, self.work / f"{name}.out")

    def sidecar(self, w: Worker, common: list[str], extra: list[str]) -> None:
        self.start(w.wid, sidecar_argv(w, common, extra), w.env)

    def router(
        self, port: int, model: Path, workers: Sequence[Worker], extra: Sequence[str] = ()
    ) -> str:
        """Starts FluidPD's router over ``workers``; returns its URL."""
        self.start("router", router_argv(port, model, workers, extra))
        return f"http://127.0.0.1:{port}"

    def dead(self) -> list[str]:
        return [f"{n} (rc {p.returncode})" for n, p in self.procs.items() if p.poll() is not None]

    def stop(self, name: str | None = None) -> None:
        names = [name] if name else list(self.procs)
        stop_procs(self.procs[n] for n in names if n in self.procs)
        if name:
            self.procs.pop(name, None)

    def logs(self, out: Path, lines: int = 60) -> None:
        """Tails of every log of the work dir, in one file."""
        with out.open("w") as f:
            for path in sorted(self.work.glob("*.out")) + sorted(self.work.glob("*.log")):
                text = path.read_text(errors="replace").splitlines()
                f.write(f"===== {path.name} ({len(text)} lines, last {lines})\n")
                f.write("\n".join(text[-lines:]) + "\n")


async def wait_ready(c: httpx.AsyncClient, stack: Stack, urls: list[str], timeout: float) -> float:
    t0 = time.monotonic()
    last = -30.0
    while time.monotonic() - t0 < timeout:
        if stack.dead():
            raise RuntimeError(f"exited while starting: {', '.join(stack.dead())}")
        ok = []
        for u in urls:
            with contextlib.suppress(httpx.HTTPError):
                ok.append((await c.get(u, timeout=5)).status_code == 200)
        if len(ok) == len(urls) and all(ok):
            return time.monotonic() - t0
        if time.monotonic() - last > 20:
            last = time.monotonic()
            print(f"[stack] {time.monotonic() - t0:.0f} s: ready {sum(ok)}/{len(urls)}", flush=True)
        await asyncio.sleep(1.0)
    raise RuntimeError(f"not ready within {timeout:.0f} s: {urls}")


async def sglang_info(c: httpx.AsyncClient, stack: Stack, w: Worker) -> dict[str, Any]:
    r = await c.get(f"{w.url}/v1/internal/sglang", headers=stack.headers, timeout=10)
    r.raise_for_status()
    return dict(r.json())


async def start_minilb(
    c: httpx.AsyncClient, stack: Stack, workers: list[Worker], port: int, model: str
) -> str:
    """The plain SGLang P/D balancer straight onto the workers' SGLang servers."""
    argv = [sys.executable, str(HERE / "sglang_minilb.py"), "--port", str(port), "--model", model]
    for w in workers:
        info = await sglang_info(c, stack, w)
        if w.role == "prefill":
            argv += [
                "--prefill",
                f"{info['url']},{info['bootstrap_host']},{info['bootstrap_port']}",
            ]
        else:
            argv += ["--decode", str(info["url"])]
    stack.start("minilb", argv)
    url = f"http://127.0.0.1:{port}"
    await wait_ready(c, stack, [f"{url}/healthz"], 60)
    return url


async def complete(
    c: httpx.AsyncClient, base: str, model: str, ids: list[int], new: int, ignore_eos: bool = True
) -> dict[str, Any]:
    """One streamed completion (greedy): TTFT, wall time, tokens, text; ``error`` None or why
    it failed (an HTTP error, an error event in the stream)."""
    body = {"model": model, "prompt": [ids], "max_tokens": new, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": ignore_eos}  # fmt: skip
    t0 = time.perf_counter()
    first: float | None = None
    n = chunks = 0
    err = None
    text = ""
    try:
        async with c.stream("POST", f"{base}/v1/completions", json=body) as r:
            if r.status_code != 200:
                err = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    d = json.loads(line[5:])
                    if d.get("error"):
                        err = str(d["error"])[:200]
                    ch = d.get("choices") or []
                    if ch and ch[0].get("text"):
                        chunks += 1
                        text += ch[0]["text"]
                        if first is None:
                            first = time.perf_counter() - t0
                    if d.get("usage"):
                        n = int(d["usage"].get("completion_tokens") or 0)
    except httpx.HTTPError as exc:
        err = repr(exc)[:200]
    wall = time.perf_counter() - t0
    return {"ttft_s": first, "wall_s": wall, "tokens": n or chunks, "text": text, "error": err}


async def timed_load(
    c: httpx.AsyncClient, base: str, model: str, prompts: list[list[int]], new: int, conc: int
) -> tuple[list[dict[str, Any]], float]:
    """Every prompt as a streamed completion (``complete``, ignore_eos), at most ``conc`` at a
    time; their results in prompt order and the wall time of all of them."""
    sem = asyncio.Semaphore(conc)

    async def one(ids: list[int]) -> dict[str, Any]:
        async with sem:
            return await complete(c, base, model, ids, new)

    t0 = time.perf_counter()
    res = await asyncio.gather(*(one(p) for p in prompts))
    return list(res), time.perf_counter() - t0


async def generate(
    c: httpx.AsyncClient, url: str, ids: list[int], new: int, extra: dict[str, Any] | None = None,
    *, ignore_eos: bool = True, logprobs: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """SGLang's native ``/generate`` (greedy); its answer plus ``wall_s``. ``logprobs``: with
    the top two log-probabilities per output token; ``extra``: more body fields."""
    body: dict[str, Any] = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": ignore_eos},
        **({"return_logprob": True, "top_logprobs_num": 2} if logprobs else {}),
        **(extra or {}),
    }
    t0 = time.perf_counter()
    r = await c.post(f"{url}/generate", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"{url}/generate: {r.status_code} {r.text[:300]}")
    out = dict(r.json())
    out["wall_s"] = time.perf_counter() - t0
    return out


def term_as_interrupt() -> None:
    """SIGTERM (``timeout``, the machine's limit) unwinds like Ctrl-C, so the ``finally`` that
    stops every SGLang server and writes the JSON runs: a server left behind would hold GPU
    memory for the next command."""

    def handler(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def pct(xs: list[float], q: float) -> float | None:
    """The q-quantile, linear between the two nearest samples (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    k = q * (len(s) - 1)
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)
