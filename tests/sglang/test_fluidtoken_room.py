"""FluidToken's suffix extend inside SGLang's decode scheduler waits for room in every running
stream's TPOT (``fluidtoken_hook.Streams``, ``extend_next``), as the core's decode scheduler
does in the simulator and the sim engine; and the decode sidecar tells the hook, over the
hook's real HTTP server, what the room is weighed against.

SGLang's requests are stand-ins here with the fields the hook reads (``time_stats``,
``output_ids``, ``sampling_params``, ``finished``); the real scheduler runs the same code in
test_sglang_shared_stack.py, and ``test_sglang_python_imports_the_core`` checks that SGLang's
own interpreter finds the core the hook imports."""

from __future__ import annotations

import asyncio
import math
import subprocess
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from fluidpd.api.internal import SuffixCommit
from fluidpd.core.fluidtoken import FluidTokenConfig, stream_tpot_room
from fluidpd.core.types import SLO
from fluidpd.profiles import resolve_profile
from fluidpd_sidecar.sglang import fluidtoken_hook, hook
from fluidpd_sidecar.sglang.fluidtoken import DecodeSplits
from fluidpd_sidecar.sglang.fluidtoken_hook import Streams, _Split
from fluidpd_sidecar.sglang.server import SglangConfig, core_path, server_env

PROFILE = resolve_profile("llama-3.1-8b", "a100-80gb", None)


def _req(rid: str, first: float, out: int, limit: int, done: bool = False) -> Any:
    """A running SGLang request: first token at ``first`` (``perf_counter``), ``out`` tokens."""
    return SimpleNamespace(
        rid=rid,
        time_stats=SimpleNamespace(decode_prebuilt_finish_time=first, prefill_finished_time=0.0),
        output_ids=list(range(out)),
        sampling_params=SimpleNamespace(max_new_tokens=limit),
        finished=lambda: done,
    )


def _streams(*periods: float) -> Streams:
    streams = Streams()
    t = 100.0
    streams.observe(t, decoded=False)
    for p in periods:
        t += p
        streams.observe(t, decoded=True)
    return streams


def test_the_iteration_is_the_mean_time_per_decode_step_with_extends_and_idle_left_out() -> None:
    streams = Streams()
    streams.observe(0.0, decoded=False)
    streams.observe(0.020, decoded=True)
    streams.observe(0.520, decoded=False, extended=_Split(100, 0.5, 0.05, 0.0))  # an extend
    streams.observe(0.550, decoded=True)
    streams.observe(0.560, decoded=False)  # SGLang's step for arriving requests: time, no token
    streams.observe(0.585, decoded=True)
    streams.observe(0.985, decoded=True)  # one slow step (a transfer landing)
    streams.observe(1.500, decoded=False, idle=True)  # nothing ran: nobody waited
    # (20 + 30 + 10 + 25 + 400) ms over four decode steps; the fastest step 20 ms.
    assert streams.iteration_s() == pytest.approx(0.12125)
    assert streams.fastest_s() == pytest.approx(0.020)
    assert Streams().iteration_s() == 0.0


def test_a_stream_at_the_edge_is_kept_while_the_fastest_steps_could_still_save_it() -> None:
    # A 4-token stream, 1 token out 75 ms ago, at a 50 ms TPOT: 75 ms of its 150 ms budget are
    # left for 3 steps. Steps of 26 ms (mean) need 78: it reads 3 ms past its room. It is
    # given up only if even the fastest step seen (22 ms, 66 in all) could not save it.
    streams = _streams(0.022, 0.030, 0.026)
    now = 200.0
    edge = _req("a", now - 0.075, 1, 4)
    assert streams.iteration_s() == pytest.approx(0.026)
    assert streams.room(now, 0.05, [edge]) == 0.0
    assert not streams.fits(_Split(100, 0.001, 0.05, 0.0), now, [edge])
    # Without the fastest step (the core's default), the stream is lost and holds nothing.
    assert stream_tpot_room(0.05, 0.026, [(0.075, 1, 4)]) == math.inf
    # Past even the fastest pace: given up.
    lost = _req("b", now - 0.090, 1, 4)
    assert streams.fits(_Split(100, 10.0, 0.05, 0.0), now, [lost])


def test_a_suffix_runs_only_within_a_short_streams_tpot_room() -> None:
    # A 4-token stream, 1 token out 20 ms ago, on a worker decoding every 26 ms at a 50 ms
    # TPOT: its three gaps may take 150 ms, 20 + 3 x 26 are spent or needed, 52 ms are left.
    streams = _streams(0.026, 0.026, 0.026)
    now = 200.0
    short = _req("a", now - 0.020, 1, 4)
    room = streams.room(now, 0.05, [short])
    assert room == pytest.approx(0.052)
    assert room == pytest.approx(stream_tpot_room(0.05, 0.026, [(0.020, 1, 4)]))
    assert streams.fits(_Split(100, 0.050, 0.05, 0.0), now, [short])
    assert not streams.fits(_Split(100, 0.055, 0.05, 0.0), now, [short])
    # A long stream beside it has more room: the short one still decides.
    long = _req("b", now - 1.0, 30, 500)
    assert not streams.fits(_Split(100, 0.055, 0.05, 0.0), now, [long, short])
    assert streams.fits(_Split(100, 0.055, 0.05, 0.0), now, [long])


def test_streams_that_cannot_be_kept_or_are_leaving_hold_nothing_back() -> None:
    streams = _streams(0.026)
    now = 50.0
    late = _req("late", now - 0.5, 2, 4)  # 0.5 s after its first token: past 3 x 50 ms already
    done = _req("done", now - 0.010, 1, 2, done=True)
    waiting = _req("new", 0.0, 0, 4)  # no first token yet
    big = _Split(100, 10.0, 0.05, 0.0)
    assert streams.fits(big, now, [late, done, waiting])
    # No TPOT said (a caller of the hook's route that predates it), or nothing running.
    assert streams.fits(_Split(100, 10.0, 0.0, 0.0), now, [_req("a", now, 1, 4)])
    assert streams.fits(big, now, [])


def test_extends_slower_than_predicted_stretch_every_later_prediction(clean_hook: None) -> None:
    # A 4-token stream with 52 ms of room (as above); the decode sidecar predicts 50 ms.
    streams = _streams(0.026, 0.026, 0.026)
    now = 200.0
    short = _req("a", now - 0.020, 1, 4)
    split = _Split(100, 0.050, 0.05, 0.0)
    assert streams.fits(split, now, [short])
    seconds = fluidtoken_hook._stats["extend_seconds"]
    # An extend the sidecar predicted at 40 ms ran 80 ms (a profile of a faster GPU): the
    # next 50 ms prediction is read as 100 ms, past the room.
    t = streams.last_call
    assert t is not None
    streams.observe(t + 0.080, decoded=False, extended=_Split(100, 0.040, 0.05, 0.0))
    assert streams.extend_error.stretch == pytest.approx(2.0)
    assert not streams.fits(split, now, [short])
    assert fluidtoken_hook._stats["extend_seconds"] == pytest.approx(seconds + 0.080)
    # An extend is not a decode iteration: the period the room uses is unchanged.
    assert streams.iteration_s() == pytest.approx(0.026)
    # Extends faster than predicted never shrink a prediction below itself.
    fast = _streams(0.026)
    t = fast.last_call
    assert t is not None
    fast.observe(t + 0.010, decoded=False, extended=_Split(100, 0.040, 0.05, 0.0))
    assert fast.extend_error.stretch == 1.0


def test_steps_slowed_by_stolen_suffixes_do_not_give_a_stream_up() -> None:
    # 100 steps of 8.5 ms, then 40 of 12.5 ms while two 12,000-token suffixes decode (their
    # contexts slow every step): the iteration reads 12.5 ms, the fastest step 8.5 ms.
    streams = _streams(*([0.0085] * 100 + [0.0125] * 40))
    assert streams.iteration_s() == pytest.approx(0.0125)
    assert streams.fastest_s() == pytest.approx(0.0085)
    # A 400-token stream at a 12 ms target, 100 tokens out 1.5 s after its first: 3.29 s of
    # its 4.79 s budget left for 300 steps; 3.75 s at 12.5 ms, 2.55 s at 8.5 ms. It misses at
    # the slowed pace, but not once the suffixes' streams have left: it is kept, and the next
    # suffix waits.
    now = 500.0
    edge = _req("a", now - 1.5, 100, 400)
    assert streams.room(now, 0.012, [edge]) == 0.0
    assert not streams.fits(_Split(12000, 0.45, 0.012, 0.0), now, [edge])


def _stolen_steps(plain: float, joined: float, n: int) -> Streams:
    """``n`` decode steps of ``plain`` seconds, then ``n`` with a stolen stream in the batch."""
    streams = _streams(*([plain] * n))
    t = streams.last_call
    assert t is not None
    for _ in range(n):
        t += joined
        streams.observe(t, decoded=True, stolen=True)
    return streams


def test_what_a_stolen_stream_adds_to_a_step_is_measured_once_both_kinds_were_seen() -> None:
    # Before: the sidecar's prediction (eq. 13); after 8 steps of each kind, the difference of
    # their means: 12.5 ms with a 12,000-token stolen stream in the batch, 8.2 ms without.
    few = _stolen_steps(0.0082, 0.0125, fluidtoken_hook.JOINED_MIN - 1)
    assert few.joining_s(0.0006) == 0.0006
    seen = _stolen_steps(0.0082, 0.0125, fluidtoken_hook.JOINED_MIN)
    assert seen.joining_s(0.0006) == pytest.approx(0.0043)
    # Extends and idle calls are not steps of either kind; a faster joined mean reads 0.
    assert _stolen_steps(0.010, 0.009, 8).joining_s(0.0006) == 0.0


def test_a_suffix_waits_while_its_stream_would_slow_the_running_ones_past_their_room() -> None:
    # A 400-token stream, 100 out 2.178 s after its first token, at 12 ms: 4.788 s of budget
    # less 300 steps of 8.2 ms leaves 0.15 s, which a 50 ms extend fits. Each step beside
    # the stolen stream it adds is 4.3 ms slower once measured: 64 of them do not fit.
    streams = _stolen_steps(0.0082, 0.0125, 8)
    streams.periods.clear()
    for _ in range(32):
        streams.periods.append((0.0082, True))
    now = 500.0
    stream = _req("a", now - 2.178, 100, 400)
    assert streams.room(now, 0.012, [stream]) == pytest.approx(0.15)
    split = _Split(12000, 0.05, 0.012, 0.0, 0.0006)
    assert streams.fits(split, now, [stream])  # no step count: the extend alone
    assert not streams.fits(split, now, [stream], steps=64)  # 0.05 + 64 x 4.3 ms > 0.15
    assert streams.fits(split, now, [stream], steps=20)  # 0.05 + 20 x 4.3 ms < 0.15
    # A stolen stream already in the batch with 63 tokens to go: the mean iteration holds the
    # steps it slows, and the new one's are counted only past them.
    running = _req("s", now - 0.01, 1, 64)
    setattr(running, fluidtoken_hook._STOLEN, True)
    assert streams.fits(split, now, [stream, running], steps=64)


@pytest.fixture
def clean_hook() -> Iterator[None]:
    saved = (fluidtoken_hook._streams, dict(fluidtoken_hook._stats))
    yield
    fluidtoken_hook._streams = saved[0]
    fluidtoken_hook._stats.clear()
    fluidtoken_hook._stats.update(saved[1])
    fluidtoken_hook._splits.clear()


def test_the_first_waiting_suffix_waits_and_the_batch_decodes_meanwhile(clean_hook: None) -> None:
    fluidtoken_hook._streams = _streams(0.026, 0.026)
    now = 300.0
    short = _req("s", now - 0.020, 1, 4)
    queued = [_req("x", 0.0, 0, 4), _req("y", 0.0, 0, 4)]
    setattr(queued[0], fluidtoken_hook._PENDING, _Split(800, 0.2, 0.05, 0.0))
    setattr(queued[1], fluidtoken_hook._PENDING, _Split(10, 0.001, 0.05, 0.0))
    held = fluidtoken_hook._stats["held"]
    extend_next = fluidtoken_hook.extend_next
    # FIFO: the small one behind does not jump the queue.
    assert extend_next(queued, False, [short], now) is None
    assert fluidtoken_hook._stats["held"] == held + 1
    assert extend_next(queued, False, [], now) is queued[0]  # the stream ended: room
    # One extend per iteration while streams run, whatever the room.
    assert extend_next(queued[1:], True, [short], now) is None
    assert extend_next(queued[1:], False, [short], now) is queued[1]


def test_the_decode_sidecar_registers_the_suffix_time_and_tpot_over_http(
    clean_hook: None,
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), hook._Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    slo = SLO(ttft=1.0, tpot=0.05)
    splits = DecodeSplits(
        PROFILE, slo, FluidTokenConfig(), f"http://127.0.0.1:{server.server_port}"
    )

    async def register() -> None:
        async with aiohttp.ClientSession() as client:
            await splits.register(client, SuffixCommit(rid=42, tokens=700, prefix=3000))

    try:
        asyncio.run(register())
    finally:
        server.shutdown()
        server.server_close()
    split = fluidtoken_hook._splits["42"]
    assert split.tokens == 700 and split.tpot == 0.05
    assert split.suffix_s == pytest.approx(PROFILE.suffix_predictor().time(700, 3000))
    assert split.suffix_s > PROFILE.suffix_predictor().time(700, 0)  # the prefix counts
    assert split.step_s == pytest.approx(PROFILE.decode_predictor().added(3700))
    bad = fluidtoken_hook.handle_post("/split", {"rid": "1", "suffix": 5, "tpot": -1})
    assert bad[0] == 400 and "tpot" in bad[1]["error"]
    bad = fluidtoken_hook.handle_post("/split", {"rid": "1", "suffix": 5, "step_s": "nan"})
    assert bad[0] == 400 and "step_s" in bad[1]["error"]


def test_sglang_python_imports_the_core(sglang_python: str, tmp_path: Path) -> None:
    """SGLang's own interpreter, with the environment a server gets, imports the hook and the
    core it uses, and not the checkout's other top-level folders."""
    home = core_path(tmp_path)
    cfg = SglangConfig(python=sglang_python, model_dir=tmp_path, port=1, hook_port=2, device="cpu")
    env = server_env(cfg, core=home)
    check = (
        "import importlib.util as u, fluidpd_sidecar.sglang.fluidtoken_hook as h; "
        "import fluidpd.core.fluidtoken as f; "
        "assert h.stream_tpot_room is f.stream_tpot_room; "
        "assert u.find_spec('e2e') is None and u.find_spec('conftest') is None; print('ok')"
    )
    done = subprocess.run(
        [sglang_python, "-c", check],
        check=False,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    assert core_path(tmp_path) == home  # a second sidecar beside it reuses the link
