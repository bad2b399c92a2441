"""``--engine sglang`` against real SGLang 0.5.17 servers on CPU (the recipe of
shared/notes/sglang-on-h200.md), with a tiny random-weight Llama built at test time: one
``fluidpd up --engine sglang --pd 2P1D`` deployment and one plain non-disaggregated SGLang
server (the reference) for the whole module.

Each SGLang server takes 60-150 s to start on two cores (more on a loaded machine), so the
text, protocol, observable, FluidToken, FluidRole and crash tests share these four servers
(they were 13-17, one stack per module and per beta, and overlapped in CI until one did not
come up in time). The tests run in file order, which matters:

1. the launch (every worker role-neutral, no switch yet), greedy text through FluidPD equal to
   plain SGLang, the decode half at the protocol level (and ``unless_started`` aborts), the
   observables under load;
2. FluidToken at forced beta = 0, 0.5 and 1 (``PUT /admin/fluidtoken`` on the running prefill
   workers; the override is cleared after each test), with a pipelined burst at each beta;
3. FluidRole: in-place P->D and D->P switches under load (mutates the roles);
4. a crashed SGLang under the decode sidecar is restarted (mutates the process).

KV moves over SGLang's own Mooncake TCP transfer. SGLang lives in its own venv, made (once,
cached) by ``scripts/sglang/mkvenv.sh``. Every server runs float32 (``DTYPE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from fluidpd.api.sampling import SamplingParams
from fluidpd.drills.stack import urls_of
from fluidpd.modeldir.model_dir import load_model_dir
from fluidpd.modeldir.text import TokenText
from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer, free_ports
from fluidpd_sidecar.sglang.wire import new_tokens
from fluidpd_sidecar.stopping import OutputStream

#: Each SGLang server's start limit. Four start at once on two cores, next to the other xdist
#: worker's tests: 60-150 s each alone, several times that together under load (CI hit the
#: former 600 s once), so the limit is generous; a failed start ends the wait at once anyway.
START_S = 1200.0
MAX_TOKENS = 4096
#: SGLang's auto dtype runs the float32 test checkpoint in float16, where batch composition
#: alone can flip a near-tie of greedy decoding (seen once in CI after a switch under load);
#: every server of these tests runs float32, the plain reference included.
DTYPE = "float32"
TOKEN = "sglang-stack-test"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: FluidToken's pipelined prefill planner releases at most this many requests into SGLang's
#: prefill server at once (``--sglang-prefill-window``).
WINDOW = 2
PREFILL, DECODE = ("w0", "w1"), "w2"


@dataclass
class Up:
    router: str
    #: Sidecar URLs by worker id: w0 and w1 start as prefill, w2 as decode.
    workers: dict[str, str]
    run_dir: Path
    model: Path
    plain: SglangServer

    def get(self, wid: str, path: str) -> httpx.Response:
        return httpx.get(f"{self.workers[wid]}{path}", headers=AUTH, timeout=10)


def _tails(run_dir: Path, lines: int = 15) -> str:
    """The end of every log of a stack that did not come up: the reason is in one of them."""
    parts = []
    for log in sorted([*run_dir.glob("*.log"), *run_dir.glob("*.out")]):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log.name}\n" + "\n".join(tail))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def up(
    sglang_python: str, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Up]:
    run_dir = tmp_path_factory.mktemp("sglang-up")
    plain_port, hook = free_ports(2)
    # Static: no controller switches roles behind the tests' backs (FluidRole's test switches
    # them itself), and FluidToken is forced per test through the admin route.
    cmd = [
        sys.executable, "-m", "fluidpd.cli.main", "up", "--engine", "sglang", "--pd", "2P1D",
        "--policy", "static", "--device", "cpu", "--model-dir", str(tiny_llama_dir),
        "--sglang-python", sglang_python, "--sglang-max-total-tokens", str(MAX_TOKENS),
        "--sglang-start-timeout", str(START_S), "--port", "0",
        "--run-dir", str(run_dir), "--admin-token", TOKEN, "--sglang-dtype", DTYPE,
        "--sglang-prefill-window", str(WINDOW),
        # SGLang on 2 shared CPU cores takes tens of seconds for a burst's first tokens (the
        # 60 s default was hit once in CI).
        "--first-token-timeout", "300",
    ]  # fmt: skip
    env = {**os.environ, "FLUIDPD_LOG_DIR": str(run_dir)}
    out = (run_dir / "up.out").open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=run_dir)
    plain = SglangServer(
        SglangConfig(
            python=sglang_python, model_dir=tiny_llama_dir, port=plain_port, hook_port=hook,
            device="cpu", max_total_tokens=MAX_TOKENS, dtype=DTYPE,
            log_path=run_dir / "plain-sglang.log", start_timeout_s=START_S,
        )
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    try:
        # The plain server starts while the stack's three do (its start raises with its log's
        # tail if it fails).
        loop.run_until_complete(plain.start())
        t0 = time.monotonic()
        while not (run_dir / "endpoint").exists():  # written once every worker is ready
            assert proc.poll() is None, f"fluidpd up exited:\n{_tails(run_dir)}"
            waited = time.monotonic() - t0
            assert waited < START_S + 120, f"not up in {waited:.0f} s:\n{_tails(run_dir)}"
            time.sleep(1.0)
        yield Up(*urls_of(run_dir), run_dir, tiny_llama_dir, plain)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        loop.run_until_complete(plain.stop())
        loop.close()


def _plain_ids(up: Up, ids: list[int], n: int) -> list[int]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0}}
    r = httpx.post(f"{up.plain.cfg.url}/generate", json=body, timeout=300)
    r.raise_for_status()
    return [t.id for t in new_tokens(r.json(), 0)]


def _text(model: Path, ids: list[int], n: int) -> str:
    """What FluidPD's decode sidecar makes of these output ids (same detokenizer, stopping)."""
    md = load_model_dir(model)
    stream = OutputStream(TokenText.from_model_dir(md), SamplingParams(max_new_tokens=n),
                          md.eos_token_ids)  # fmt: skip
    stream.feed(new_tokens({"output_ids": ids}, 0))
    stream.end()
    return stream.take(final=True)[1]


def _client(up: Up, timeout: float = 300) -> OpenAI:
    return OpenAI(base_url=f"{up.router}/v1", api_key=TOKEN, max_retries=0, timeout=timeout)


@contextlib.contextmanager
def _forced(up: Up, beta: float) -> Iterator[None]:
    """Every prompt the prefill workers start runs with stealing ratio ``beta`` meanwhile
    (``PUT /admin/fluidtoken``), then FluidToken is off again (the launch's static policy)."""

    def put(value: float | None) -> None:
        for wid in PREFILL:
            r = httpx.put(f"{up.workers[wid]}/admin/fluidtoken", json={"force_steal": value},
                          headers=AUTH, timeout=10)  # fmt: skip
            assert r.status_code == 200 and r.json() == {"force_steal": value}, r.text

    put(beta)
    try:
        yield
    finally:
        put(None)


def _suffix(up: Up) -> dict[str, float]:
    """The decode server's hook: stolen suffixes run as extends, their tokens, and iterations
    one waited for a running stream's TPOT room."""
    return dict(up.get(DECODE, "/v1/internal/sglang").json()["suffix"])


def _stolen(up: Up) -> int:
    """Prompt tokens the prefill workers left to the decode worker so far, together."""
    return sum(int(up.get(wid, "/pressure").json()["stolen_tokens"]) for wid in PREFILL)


# -- 1. the launch, text, protocol and observables ----------------------------------------------


def test_every_worker_is_launched_role_neutral(up: Up) -> None:
    """FluidRole's launch (switched below): every SGLang server started as the decode
    superset with a bootstrap server each; the prefill ones were flipped in place."""
    for wid, role in (("w0", "prefill"), ("w1", "prefill"), ("w2", "decode")):
        info = up.get(wid, "/v1/internal/sglang").json()
        assert info["mode"] == role and info["bootstrap_port"], info
        status = up.get(wid, "/role").json()
        assert (status["role"], status["state"], status["switches"]) == (role, "active", 0)
        # Asking for the role it has is a no-op, not a switch.
        r = httpx.post(f"{up.workers[wid]}/role", json={"role": role}, headers=AUTH)
        assert r.status_code == 200 and r.json()["switches"] == 0
    log = (up.run_dir / "sglang-w0.log").read_text(errors="replace")
    assert "disaggregation_mode='decode'" in log


def test_greedy_text_through_fluidpd_equals_plain_sglang(up: Up) -> None:
    client = _client(up, timeout=120)
    model = client.models.list().data[0].id
    for k, length in enumerate((5, 23, 61)):
        ids = [(17 * k + 7 * i) % 900 + 20 for i in range(length)]
        ref = _plain_ids(up, ids, 16)
        got = client.completions.create(model=model, prompt=[ids], max_tokens=16, temperature=0)
        assert got.choices[0].text == _text(up.model, ref, 16), (length, ref)
        assert got.usage is not None and got.usage.completion_tokens == len(ref)


def test_each_sidecar_logs_the_life_cycle_of_a_request(up: Up) -> None:
    """The sglang sidecar's log lines are the sim/gpu sidecar's: one grep for "request <rid> "
    over the logs traces a request whatever the engine (issue #16)."""
    client = _client(up, timeout=120)
    model = client.models.list().data[0].id
    client.completions.create(model=model, prompt=[[20 + i for i in range(9)]], max_tokens=3)
    router = (up.run_dir / "router.log").read_text(errors="replace")
    rids = re.findall(r"request (\d+) admitted \(cmpl-\w+\): 9 prompt tokens", router)
    assert rids, router[-2000:]
    rid = rids[-1]

    def prefill_logs() -> str:  # (either prefill worker may have had it)
        return "".join((up.run_dir / f"{w}.log").read_text(errors="replace") for w in PREFILL)

    # The prefill half's answer can come after the client's last token: give it a moment.
    deadline = time.monotonic() + 30
    p = prefill_logs()
    while time.monotonic() < deadline and f"request {rid} prefill done" not in p:
        time.sleep(0.2)
        p = prefill_logs()
    d = (up.run_dir / f"{DECODE}.log").read_text(errors="replace")
    assert re.search(rf"request {rid} admitted for prefill \(9 prompt tokens, decode on {DECODE}\)",
                     p), p[-2000:]  # fmt: skip
    assert re.search(rf"request {rid} prefill done: \d+ stolen", p), p[-2000:]
    assert re.search(rf"request {rid} admitted for decode \(9 prompt tokens, up to 3 new", d)
    assert re.search(rf"request {rid} finished \(\w+, \d+ tokens\)", d), d[-2000:]


def test_decode_half_streams_plain_sglang_ids(up: Up) -> None:
    """The P/D halves at the protocol level: the decode stream's ids are SGLang's own. An
    ``unless_started`` abort (the router's after a prefill half that ended badly) spares the
    decode half once it decodes, and cancels one that has not started."""
    ids = [(11 * i) % 700 + 30 for i in range(40)]
    ref = _plain_ids(up, ids, 24)
    # Long enough that the abort sent at the first streamed ids arrives while the half still
    # decodes (with 24 tokens, and with 200 on a loaded CI machine, the half had ended first:
    # nothing to spare).
    new = 480
    rid, idle_rid = 4242, 4343
    prefill, decode = up.workers["w0"], up.workers[DECODE]

    def half(rid: int) -> dict[str, object]:
        return {"rid": rid, "prompt_ids": ids, "arrival": time.time(),
                "sampling": {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True},
                "prefill_worker": "w0", "prefill_url": prefill}  # fmt: skip

    got: list[int] = []
    why = "prefill half cancelled"

    async def run() -> tuple[str, bool, list[str], bool]:
        async with httpx.AsyncClient(timeout=120, headers=AUTH) as c:
            pre = {k: v for k, v in half(rid).items() if not k.startswith("prefill_")}
            pre |= {"decode_worker": DECODE, "decode_url": decode}
            async with c.stream("POST", f"{decode}/v1/internal/decode", json=half(rid)) as r:
                assert r.status_code == 200
                outcome = asyncio.ensure_future(c.post(f"{prefill}/v1/internal/prefill",
                                                       json=pre))  # fmt: skip
                last, spared = "", None
                async for line in r.aiter_lines():
                    if line:
                        ev = json.loads(line)
                        got.extend(ev["ids"])
                        last = ev["event"]
                        if spared is None and ev["ids"]:  # decoding: its KV is here
                            a = await c.post(f"{decode}/v1/internal/abort", json={
                                "rid": rid, "reason": why, "unless_started": True})  # fmt: skip
                            spared = a.status_code == 200 and a.json() == {"found": False}
                assert (await outcome).json()["status"] == "done"
            # A decode half whose prefill half never comes: nothing started, it is cancelled.
            async with c.stream("POST", f"{decode}/v1/internal/decode",
                                json=half(idle_rid)) as r:  # fmt: skip
                assert r.status_code == 200
                aborted = asyncio.ensure_future(c.post(f"{decode}/v1/internal/abort", json={
                    "rid": idle_rid, "reason": why, "unless_started": True}))  # fmt: skip
                idle = [json.loads(line)["event"] async for line in r.aiter_lines() if line]
                found = (await aborted).json() == {"found": True}
            return last, bool(spared), idle, found

    last, spared, idle, found = asyncio.run(run())
    assert last == "done" and spared
    # The reference stops at an EOS; with ignore_eos the decode half goes on past it.
    assert got[: len(ref)] == ref
    assert len(got) == new
    log = (up.run_dir / f"{DECODE}.log").read_text(errors="replace")
    assert f"request {rid}: abort ({why}) ignored" in log
    assert idle == ["cancelled"] and found


def test_observables_under_load(up: Up) -> None:
    """/pressure and /metrics read SGLang's scheduler through the hook while it works; the
    prefill workers hold their queues in FluidToken's planner (forced to beta = 0 here)."""
    client = AsyncOpenAI(base_url=f"{up.router}/v1", api_key=TOKEN, max_retries=0)
    # Streams long enough to overlap on the decode worker: at 64 tokens the prompts' prefills
    # on a loaded CI machine came one after another's stream had ended (batch 1 throughout).
    out_tokens = 192
    # Four prompts per prefill worker against a planner window of 2, so each holds a queue
    # for a whole prefill, not an instant; 8 x (300 + 192) tokens still fit MAX_TOKENS at once.
    n_load = 8
    seen: dict[str, list[dict[str, object]]] = {"p": [], "d": []}
    urls = {"p": [up.workers[w] for w in PREFILL], "d": [up.workers[DECODE]]}

    async def load() -> list[int]:
        async def one(i: int) -> int:
            ids = [(i * 37 + j * 13) % 900 + 20 for j in range(300)]
            r = await client.completions.create(model="llama-3.1-8b", prompt=[ids],
                                                max_tokens=out_tokens, temperature=0,
                                                extra_body={"ignore_eos": True})  # fmt: skip
            assert r.usage is not None
            return r.usage.completion_tokens

        async def poll() -> None:
            # All workers at once and often: one at a time every 50 ms missed the prefill
            # queue once in CI (it lasts only while the planner holds the burst's tail).
            async with httpx.AsyncClient(timeout=10) as c:

                async def read(kind: str, url: str) -> None:
                    seen[kind].append((await c.get(f"{url}/pressure")).json())

                while True:
                    await asyncio.gather(*(read(k, u) for k, g in urls.items() for u in g))
                    await asyncio.sleep(0.02)

        poller = asyncio.ensure_future(poll())
        try:
            return await asyncio.gather(*(one(i) for i in range(n_load)))
        finally:
            poller.cancel()

    with _forced(up, 0.0):
        tokens = asyncio.run(load())
    assert tokens == [out_tokens] * n_load  # nothing lost
    d, p = seen["d"], seen["p"]
    assert max(int(x["batch"]) for x in d) >= 2  # type: ignore[call-overload]
    assert max(int(x["kv_used"]) for x in d) >= 300  # type: ignore[call-overload]
    assert {x["kv_capacity"] for x in d} == {MAX_TOKENS}
    assert max(float(x["dpi_adm"]) for x in d) > 0  # type: ignore[arg-type]
    assert max(int(x["queue_len"]) for x in p) >= 1  # type: ignore[call-overload]
    assert max(float(x["queue_ppi"]) for x in p) > 0  # type: ignore[arg-type]
    metrics = httpx.get(f"{up.workers[DECODE]}/metrics").text
    assert f'fluidpd_kv_capacity_tokens{{worker="{DECODE}"}} {float(MAX_TOKENS)}' in metrics
    assert f'fluidpd_ttft_seconds_count{{worker="{DECODE}"}}' in metrics
    assert f'fluidpd_sglang_step_seconds{{kind="decode",worker="{DECODE}"}}' in metrics
    info = up.get("w0", "/v1/internal/sglang").json()
    assert info["mode"] == "prefill" and info["bootstrap_port"] and info["pid"]


# -- 2. FluidToken at forced betas ----------------------------------------------------------------
# beta = 0.5: a prefill server computes the first half of each prompt and ships its KV, the
# decode server runs the second half as an extend over it (``fluidtoken_hook``); beta = 1: the
# prefill server is not asked at all and the decode server computes the whole prompt. A decode
# server that skipped the suffix (SGLang's prebuilt path) would decode from a half-empty cache
# and the prefill server's token of the wrong position, so the texts would differ.

NEW = 12
LENGTHS = (23, 61)
#: Prompt lengths of the burst (long enough that a prefill forward is not instant on CPU).
BURST = (301, 257, 420, 188, 350, 275)
BETAS = pytest.mark.parametrize("beta", [0.0, 0.5, 1.0], ids=lambda b: f"beta={b}")


def _split(n: int, beta: float) -> int:
    """Tokens of an ``n``-token prompt left to the decode worker at ``beta``."""
    return n - round((1.0 - beta) * n)


@BETAS
def test_forced_split_greedy_text_equals_plain_sglang(up: Up, beta: float) -> None:
    client = _client(up)
    model = client.models.list().data[0].id
    before = _stolen(up)
    extends = _suffix(up)
    with _forced(up, beta):
        for k, length in enumerate(LENGTHS):
            ids = [(13 * k + 11 * i) % 900 + 20 for i in range(length)]
            ref = _plain_ids(up, ids, NEW)
            got = client.completions.create(model=model, prompt=[ids], max_tokens=NEW,
                                            temperature=0)  # fmt: skip
            assert got.choices[0].text == _text(up.model, ref, NEW), (beta, length, ref)
            assert got.usage is not None and got.usage.completion_tokens == len(ref)
    # The prefill workers' core schedulers made exactly the forced splits and report them;
    # the decode worker advertises a budget from SGLang's decode state.
    assert _stolen(up) - before == sum(_split(n, beta) for n in LENGTHS)
    for wid in PREFILL:
        assert up.get(wid, "/pressure").json()["role"] == "prefill"
    decode = up.get(DECODE, "/pressure").json()
    assert decode["role"] == "decode" and decode["steal_budget"] >= 0.0
    # Each stolen suffix ran as one extend in the decode server's scheduler (none was held
    # for a stream's TPOT room for good: each request ran alone), and the counters say so.
    runs = [_split(n, beta) for n in LENGTHS if _split(n, beta)]
    want = {"extends": extends["extends"] + len(runs),
            "extend_tokens": extends["extend_tokens"] + sum(runs)}  # fmt: skip
    deadline = time.monotonic() + 10
    while {k: _suffix(up)[k] for k in want} != want and time.monotonic() < deadline:
        time.sleep(0.2)  # the sidecar reads the hook every few hundred ms
    assert {k: _suffix(up)[k] for k in want} == want, (_suffix(up), want)
    # The scheduler timed them, beside the decode sidecar's predictions.
    if runs:
        for key in ("extend_seconds", "extend_predicted_seconds"):
            assert _suffix(up)[key] > extends[key], (key, _suffix(up), extends)
    metrics = up.get(DECODE, "/metrics").text
    assert f'fluidpd_sglang_suffix_extends_total{{worker="{DECODE}"}} {float(want["extends"])}' in (
        metrics
    ), [m for m in metrics.splitlines() if "suffix" in m]


@BETAS
def test_a_burst_is_pipelined_into_the_prefill_server_with_unchanged_greedy_text(
    up: Up, beta: float
) -> None:
    """The burst's requests go to SGLang's prefill servers at most ``WINDOW`` at a time: the
    next as soon as SGLang's forward of the previous is done, while its KV is still in
    transfer (before the pipelining the planner awaited each request's whole SGLang call:
    never more than one in a prefill server). At beta = 1 the decode server computes it all."""
    prompts = [[(17 * k + 7 * i) % 900 + 20 for i in range(n)] for k, n in enumerate(BURST)]
    refs = [_plain_ids(up, ids, NEW) for ids in prompts]
    client = _client(up, timeout=600)
    model = client.models.list().data[0].id
    stolen_before = _stolen(up)
    overlapped_before = sum(up.get(w, "/v1/internal/sglang").json()["prefill_overlapped"]
                            for w in PREFILL)  # fmt: skip

    def complete(ids: list[int]) -> str:
        got = client.completions.create(model=model, prompt=[ids], max_tokens=NEW, temperature=0)
        return got.choices[0].text

    with _forced(up, beta), ThreadPoolExecutor(len(prompts)) as pool:  # the whole burst at once
        texts = list(pool.map(complete, prompts))
    for ids, ref, text in zip(prompts, refs, texts, strict=True):
        assert text == _text(up.model, ref, NEW), (beta, len(ids), ref)

    infos = [up.get(w, "/v1/internal/sglang").json() for w in PREFILL]
    for info in infos:
        # Never more than the window in a prefill server (the most at once, ever).
        assert info["prefill_window"] == WINDOW and info["prefill_in_flight"] == 0, info
        assert info["prefill_in_flight_max"] <= WINDOW, info
    if beta < 1.0:  # (at beta = 1 the decode server computes every prompt whole)
        # More than one request in a prefill server at once during this burst.
        assert max(i["prefill_in_flight_max"] for i in infos) == WINDOW, infos
        assert sum(i["prefill_overlapped"] for i in infos) - overlapped_before >= 1, infos
    assert _stolen(up) - stolen_before == sum(_split(n, beta) for n in BURST)


# -- 3. FluidRole: in-place switches under load (mutates the roles) ------------------------------
# While requests stream, the prefill w1 becomes a decode worker and then the decode w2 becomes
# a prefill worker (so each role always has a worker). Checked: every request completes with the
# same greedy text as before any switch (equal to plain SGLang's, above), the SGLang process of
# each switched worker is the same one (pid, no restart, weights loaded once), and the switch is
# reported by /role, /pressure and /metrics as for the other engines.

N_PROMPTS = 6
NEW_TOKENS = 24


def _prompt(i: int) -> list[int]:
    return [(i * 29 + j * 11) % 900 + 20 for j in range(40 + 7 * i)]


async def _complete(client: AsyncOpenAI, i: int) -> tuple[str, int]:
    r = await client.completions.create(
        model="llama-3.1-8b", prompt=[_prompt(i)], max_tokens=NEW_TOKENS, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert r.usage is not None
    return r.choices[0].text, r.usage.completion_tokens


async def _switch(up: Up, wid: str, role: str) -> float:
    """POST /role and wait until the worker is active in ``role``; the wall time."""
    t0 = time.monotonic()
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as c:
        r = await c.post(f"{up.workers[wid]}/role", json={"role": role, "drain": "wait"})
        assert r.status_code == 200, r.text
        while True:
            st = (await c.get(f"{up.workers[wid]}/role")).json()
            if st["state"] == "active" and st["role"] == role:
                return time.monotonic() - t0
            assert time.monotonic() - t0 < 300, st
            await asyncio.sleep(0.1)


def _weight_loads(up: Up, wid: str) -> int:
    log = (up.run_dir / f"sglang-{wid}.log").read_text(errors="replace")
    return log.count("Load weight end")


def test_switches_under_load_lose_nothing_and_keep_the_process(up: Up) -> None:
    client = AsyncOpenAI(base_url=f"{up.router}/v1", api_key=TOKEN, max_retries=0)
    before = {w: up.get(w, "/v1/internal/sglang").json() for w in up.workers}
    assert [before[w]["mode"] for w in ("w0", "w1", "w2")] == ["prefill", "prefill", "decode"]
    loads = {w: _weight_loads(up, w) for w in up.workers}
    assert all(n == 1 for n in loads.values()), loads

    async def run() -> tuple[dict[int, tuple[str, int]], list[tuple[int, tuple[str, int]]], float,
                             float]:  # fmt: skip
        refs = dict(zip(range(N_PROMPTS), await asyncio.gather(
            *(_complete(client, i) for i in range(N_PROMPTS))), strict=True))  # fmt: skip
        done: list[tuple[int, tuple[str, int]]] = []
        stop = asyncio.Event()

        async def stream(k: int) -> None:
            # A steady trickle: requests queued and in flight on every worker at each switch.
            n = 0
            while not stop.is_set() or n < 2:
                i = (k + n) % N_PROMPTS
                done.append((i, await _complete(client, i)))
                n += 1

        streams = [asyncio.ensure_future(stream(k)) for k in range(4)]
        await asyncio.sleep(2.0)
        p_to_d = await _switch(up, "w1", "decode")
        await asyncio.sleep(2.0)
        d_to_p = await _switch(up, "w2", "prefill")
        stop.set()
        await asyncio.gather(*streams)
        return refs, done, p_to_d, d_to_p

    refs, done, p_to_d, d_to_p = asyncio.run(run())
    print(f"P->D {p_to_d:.2f} s, D->P {d_to_p:.2f} s, {len(done)} requests under load")
    assert all(n == NEW_TOKENS for _, n in refs.values())
    assert len(done) >= 8
    for i, got in done:
        assert got == refs[i], (i, got, refs[i])  # every request, with the same greedy text

    after = {w: up.get(w, "/v1/internal/sglang").json() for w in up.workers}
    assert [after[w]["mode"] for w in ("w0", "w1", "w2")] == ["prefill", "decode", "prefill"]
    for w in up.workers:  # the same SGLang processes: no restart, weights loaded once
        assert after[w]["pid"] == before[w]["pid"] and after[w]["restarts"] == 0, (w, after[w])
        assert _weight_loads(up, w) == 1
    for wid, source, target in (("w1", "prefill", "decode"), ("w2", "decode", "prefill")):
        p = up.get(wid, "/pressure").json()
        assert p["role"] == target and p["state"] == "active" and p["switches"] == 1
        assert (p["last_switch_from"], p["last_switch_to"]) == (source, target)
        assert p["last_switch_finished"] > p["last_switch_started"] > 0
        m = up.get(wid, "/metrics").text
        labels = f'source="{source}",target="{target}",worker="{wid}"'
        assert f"fluidpd_role_switches_total{{{labels}}} 1.0" in m, m
        assert f'fluidpd_sglang_switch_seconds{{target="{target}",worker="{wid}"}}' in m
    # After the switches the deployment still serves, through the switched workers.
    fresh = AsyncOpenAI(base_url=f"{up.router}/v1", api_key=TOKEN, max_retries=0)
    again = asyncio.run(_complete(fresh, 0))
    assert again == refs[0]


# -- 4. a crash (mutates the decode worker's process; last) --------------------------------------


def test_crashed_sglang_is_restarted(up: Up) -> None:
    """SGLang killed under the decode sidecar: NotReady, then restarted, then serving."""
    (wid,) = [w for w in up.workers if up.get(w, "/role").json()["role"] == "decode"]
    url = up.workers[wid]
    before = up.get(wid, "/v1/internal/sglang").json()
    os.killpg(before["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    saw_not_ready = False
    while time.monotonic() - t0 < START_S:
        r = httpx.get(f"{url}/readyz", timeout=5)
        if r.status_code == 503:
            saw_not_ready = True
        elif saw_not_ready:
            break
        time.sleep(0.5)
    after = up.get(wid, "/v1/internal/sglang").json()
    assert saw_not_ready and after["restarts"] == 1 and after["pid"] != before["pid"]
    test_greedy_text_through_fluidpd_equals_plain_sglang(up)
