"""Router overhead on the code before issue 12 (main 89d3e12), for the comparison in run.sh.

That router forwarded a prompt *length* (no ids) and counted text with a hash tokenizer (one
token per word). This runs its own drill code (``fluidpd.drills.overhead`` of that commit,
importable from PYTHONPATH) with ``prompt_len`` set and, for text prompts, N words instead of
N ids (N tokens for that tokenizer). Usage: before.py N ids|text RPS SECONDS OUT.json
"""

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import orjson

import fluidpd
import fluidpd.drills.overhead as ov
import fluidpd.drills.stack as stack_mod
from fluidpd.cli.drill_cmd import FAST_PROFILE

n, fmt, rps, dur, out = (
    int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
)
# The stack must run this snapshot's code, not whatever `fluidpd` is first on PATH.
stack_mod.shutil = type("NoWhich", (), {"which": staticmethod(lambda _name: None)})()  # type: ignore[assignment]
if fmt == "text":

    async def _via_router(session, endpoint, model, n):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        body = {"model": model, "prompt": " ".join(["word"] * n), "max_tokens": 2}
        async with session.post(
            f"{endpoint}/v1/completions", data=orjson.dumps(body),
            headers={"content-type": "application/json"},
        ) as resp:  # fmt: skip
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"router HTTP {resp.status}")
        return time.perf_counter() - t0

    ov._via_router = _via_router
with tempfile.TemporaryDirectory() as tmp:
    profile = Path(tmp) / "serving-path.yaml"
    profile.write_text(FAST_PROFILE)
    extra = ("--profile", str(profile), "--noise", "0")
    with stack_mod.LocalStack(Path(tmp) / "stack", "1P1D", "static", *extra) as stack:
        result = asyncio.run(
            ov.router_overhead(
                stack.endpoint, "serving-path", stack.workers["w0"], stack.workers["w1"],
                stack.token, rps, dur, prompt_len=n,
            )
        )  # fmt: skip
        result["orphans"] = stack.stop()
result.update(
    {"prompt_tokens": n, "prompt_format": fmt, "code": "main 89d3e12 (before issue 12)",
     "code_path": fluidpd.__file__, "command": " ".join(sys.argv)}
)  # fmt: skip
Path(out).write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps(result))
