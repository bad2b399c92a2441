"""A router process keeps torch out (``router_cmd.keep_torch_out``, called by
``main.process_main`` for ``fluidpd router``): its prompts still encode, and chats still
render, exactly as ``transformers`` does with torch loaded, on both tiny checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fluidpd.modeldir.model_dir import load_model_dir
from fluidpd.router.prompts import Prompter

pytest.importorskip("transformers")

TEXTS = ["The quick brown fox", "Emoji: 😀 🚀 and 東京は日本の首都です。"]
CHAT = [{"role": "user", "content": "Say 你好 😀"}]

#: Run in a fresh interpreter: a router process's start (up to its ``--help``), then what its
#: prompts come to.
CHILD = """
import contextlib, io, json, sys
from fluidpd.cli.main import process_main
sys.argv = ["fluidpd", "router", "--help"]
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    process_main()
from fluidpd.modeldir.model_dir import load_model_dir
from fluidpd.router.prompts import Prompter
p = Prompter(load_model_dir(sys.stdin.readline().strip()))
texts, chat = json.loads(sys.stdin.readline())
print(json.dumps({
    "ids": [p.encode(t) for t in texts],
    "chat": p.chat_ids(chat) if p.has_chat_template else None,
    "torch": sys.modules.get("torch") is not None,
}))
"""


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen3_dir"])
def test_a_router_process_tokenizes_as_transformers_without_torch(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    here = Prompter(load_model_dir(model_dir))
    try:
        want = {
            "ids": [here.encode(t) for t in TEXTS],
            "chat": here.chat_ids(CHAT) if here.has_chat_template else None,
            "torch": False,
        }
    finally:
        here.close()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=f"{model_dir}\n{json.dumps([TEXTS, CHAT])}\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == want
    # transformers' advisory line about models without torch stays out of the router's log.
    assert "PyTorch was not found" not in proc.stderr, proc.stderr[-2000:]
