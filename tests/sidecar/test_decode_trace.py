"""The decode sidecar's per-request trace (``fluidpd.trace`` at DEBUG): when the first token and
the first text went out and which ids came out, so that a client TTFT (taken at the first text)
can be told from the first token's time (issue 15's live runs, 2026-12-03). Off unless asked
for: ``FLUIDPD_DEBUG_LOGGERS`` names the loggers that log at DEBUG whatever ``--log-level``."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import orjson
import pytest

from fluidpd.api.internal import DecodeHalf, Handoff
from fluidpd.api.sampling import SampledToken, SamplingParams
from fluidpd.cli.options import configure_logging
from fluidpd.core.types import Role
from tests.sidecar.helpers import reserved_peer, sim_service

PROMPT = 32
SAMPLING = SamplingParams(max_new_tokens=5, ignore_eos=True)


def _run_one(tmp_path: Path, first: int) -> None:
    async def go() -> None:
        reserved = asyncio.Event()
        runner, peer = await reserved_peer(lambda _rid: reserved.set())
        svc = sim_service(tmp_path, "d0", Role.DECODE)
        await svc.start()
        try:
            half = DecodeHalf(
                rid=1, prompt_ids=[7] * PROMPT, sampling=SAMPLING, arrival=0.0,
                prefill_worker="p0", prefill_url=peer,
            )  # fmt: skip
            state = svc.accept_decode(half)
            state.subscribed = True
            events = asyncio.ensure_future(
                asyncio.wait_for(_drain(svc.events(state)), 10)  # type: ignore[arg-type]
            )
            await asyncio.wait_for(reserved.wait(), 10)
            svc.handoff_done(
                Handoff(rid=1, prefix_tokens=PROMPT, nbytes=0, first=SampledToken(first))
            )
            await events
        finally:
            await svc.stop()
            await runner.cleanup()

    asyncio.run(go())


async def _drain(lines: object) -> list[object]:
    return [orjson.loads(line) async for line in lines]  # type: ignore[attr-defined]


def _traces(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [
        json.loads(r.getMessage().split("decode trace ", 1)[1])
        for r in caplog.records
        if r.name == "fluidpd.trace"
    ]


def test_a_finished_decode_half_is_traced_at_debug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="fluidpd.trace")
    _run_one(tmp_path, first=1000)  # " translate": text
    (rec,) = _traces(caplog)
    assert rec["rid"] == 1 and rec["prompt"] == PROMPT and rec["out"] == 5
    assert rec["ids"][0] == 1000 and len(rec["ids"]) == 5  # type: ignore[index,arg-type]
    assert rec["first_text_idx"] == 0 and rec["text_tokens"] == 5  # the sim draws text ids
    assert 0 < rec["first_token_t"] <= rec["first_text_t"] <= rec["finish_t"]  # type: ignore[operator]


def test_an_id_the_tokenizer_cannot_render_delays_the_first_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="fluidpd.trace")
    _run_one(tmp_path, first=1)  # a special id (an EOS, ignored): no text
    (rec,) = _traces(caplog)
    assert rec["ids"][0] == 1 and rec["first_text_idx"] == 1  # type: ignore[index]


def test_no_trace_at_the_default_level(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    _run_one(tmp_path, first=1000)
    assert _traces(caplog) == []


def test_debug_loggers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLUIDPD_DEBUG_LOGGERS", "fluidpd.trace, fluidpd.other")
    before = {n: logging.getLogger(n).level for n in ("fluidpd.trace", "fluidpd.other")}
    try:
        configure_logging("warning", "t")
        assert logging.getLogger("fluidpd.trace").isEnabledFor(logging.DEBUG)
        assert logging.getLogger("fluidpd.other").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("fluidpd.sidecar").isEnabledFor(logging.DEBUG)
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)
