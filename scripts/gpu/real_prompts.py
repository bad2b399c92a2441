"""The helper of ``scripts/gpu/real_prompts.sh``: real prompts through a live 2P2D stack of the
gpu engine against ``transformers``, on the 8B shape (H200) or the tiny shape (CPU dry run).

Subcommands, in the order the shell script runs them:

``model``      writes the model directory with ``fluidpd.modeldir.synthetic.write_model``: the
               Llama-3.1-8B shape (vocab 128,256, the test tokenizer padded with reserved
               tokens), seeded weights, bf16 safetensors, generated on the GPU (``--tiny``: the
               CI shape on the CPU).
``reference``  ``transformers``' ``generate(do_sample=False)`` for the prompts, as chat (the
               model's template, ``apply_chat_template(add_generation_prompt=True)``) and as
               completions (``tokenizer(prompt)``): prompt ids, output ids, raw logprobs.
``profile``    a serving profile for the stack: the 8B step-time coefficients measured on the
               H200 with a small KV pool and context limit (four workers share one GPU).
``check``      sends every prompt to the live stack (concurrently, greedy, ``ignore_eos``,
               ``logprobs`` with vLLM's ``return_tokens_as_token_ids``) and compares token ids
               (chat's also recovered from each token's exact ``bytes``, as a cross-check),
               text, logprobs and ``usage``; and that a seeded sampled request gives the same
               tokens twice.
``summary``    merges the step files into one JSON and prints a short summary.

Why fp32 for the equality run: with random weights the two most likely tokens are close
(median gap about 0.1 of the logits' standard deviation over a 128K vocabulary), and bf16
rounding moves logits by more than that (``transformers`` bf16 against its own fp32 on the same
weights diverges within the first tokens); in fp32 both implementations agree to ~1e-5 of the
logit scale, so a mismatch means a bug. The weights are stored bf16 and computed in fp32 by
both. ``init_std`` 0.02 (a trained model's scale) keeps 32 random layers from amplifying
rounding chaotically, as 0.2 does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

PROMPTS = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Emoji: 😀 🚀 🔥 ✨ and then 👩‍💻 wrote: print('héllo 🌍')",
    "東京は日本の首都です。我们正在测试一个大型语言模型的服务系统。",
    "Mixed: the model said 你好 and then 😀 before writing résumé in code.",
]


def _save(path: str | Path, data: Any) -> None:
    Path(path).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


# -- model -------------------------------------------------------------------------------------
def cmd_model(args: argparse.Namespace) -> dict[str, Any]:
    from fluidpd.modeldir.synthetic import TINY_SHAPES, write_model  # noqa: PLC0415
    from fluidpd_sidecar.gpu.config import SHAPES  # noqa: PLC0415

    t0 = time.perf_counter()
    if args.tiny:  # --vocab: the 8B's padded tokenizer on the tiny shape (a rehearsal)
        shape = None if args.vocab is None else {**TINY_SHAPES["llama"], "vocab_size": args.vocab}
        made = write_model(args.out, "llama", seed=0, shape=shape)
    else:
        shape = SHAPES["llama-3.1-8b"].to_hf_config()  # the published config.json's fields
        for device in dict.fromkeys([args.device, "cpu"]):  # the CPU only if the GPU fails
            try:
                made = write_model(
                    args.out, "llama", seed=0, shape=shape, init_std=0.02, dtype="bfloat16",
                    device=device, max_shard_size="5GB",
                )  # fmt: skip
                break
            except Exception as exc:  # reported, then the fallback runs
                print(f"write_model on {device} failed: {exc!r}", file=sys.stderr, flush=True)
                if device == "cpu":
                    raise
    size = sum(f.stat().st_size for f in Path(args.out).iterdir() if f.is_file())
    return {"path": str(made.path), "vocab_size": made.vocab_size, "files": made.files,
            "bytes": size, "init_std": 0.02 if not args.tiny else 0.2,
            "write_s": time.perf_counter() - t0}  # fmt: skip


# -- reference ---------------------------------------------------------------------------------
def _load_hf(model_dir: str, device: str, dtype: str) -> Any:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    torch_dtype = getattr(torch, dtype)
    try:  # straight onto the device (needs accelerate)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch_dtype, device_map=device
        )
    except (ImportError, ValueError):
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
        model = model.to(device)  # type: ignore[arg-type]
    return model.eval()  # type: ignore[no-untyped-call]


def prompts_ids(model_dir: str) -> list[dict[str, Any]]:
    """Each prompt as the router encodes it, for chat and for completions."""
    import transformers  # noqa: PLC0415

    tok = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    out = []
    for i, text in enumerate(PROMPTS):
        messages = [{"role": "user", "content": text}]
        chat = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append({"name": f"chat-{i}", "api": "chat", "messages": messages,
                    "ids": list(tok(chat, add_special_tokens=False)["input_ids"])})  # fmt: skip
        out.append({"name": f"completion-{i}", "api": "completions", "prompt": text,
                    "ids": list(tok(text)["input_ids"])})  # fmt: skip
    return out


def cmd_reference(args: argparse.Namespace) -> dict[str, Any]:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    t0 = time.perf_counter()
    cases = prompts_ids(args.model_dir)
    tokenize_s = time.perf_counter() - t0
    model = _load_hf(args.model_dir, args.device, args.dtype)
    load_s = time.perf_counter() - t0 - tokenize_s
    # Exactly args.new tokens, as the stack gives with ignore_eos: the model's own EOS ids
    # (generation_config.json) would otherwise stop generate early.
    model.generation_config.eos_token_id = None
    config = transformers.GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=args.new, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    for case in cases:
        x = torch.tensor([case["ids"]], device=args.device)
        with torch.inference_mode():
            res = model.generate(
                x, attention_mask=torch.ones_like(x), generation_config=config,
                output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
        out = res.sequences[0, x.shape[1] :].tolist()
        lps = [step[0].float().log_softmax(-1) for step in res.logits]
        case["output"] = out
        case["logprob"] = [float(lp[t]) for lp, t in zip(lps, out, strict=True)]
        gaps = [lp.topk(2).values for lp in lps]
        #: How far the best token led the second at each position (small: a near-tie).
        case["margin"] = [float(g[0] - g[1]) for g in gaps]
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": args.device,
        "dtype": args.dtype,
        "new_tokens": args.new,
        "tokenize_s": tokenize_s,
        "load_s": load_s,
        "generate_s": time.perf_counter() - t0 - tokenize_s - load_s,
        "cases": cases,
    }


# -- profile -----------------------------------------------------------------------------------
def cmd_profile(args: argparse.Namespace) -> dict[str, Any]:
    import yaml  # noqa: PLC0415

    data = yaml.safe_load(Path(args.base).read_text())
    data["name"] = f"{data['name']}-real-prompts"
    data["context_limit"] = args.context_limit
    data["max_running_requests"] = args.max_running
    data["kv"]["capacity_tokens"] = args.kv_tokens
    data["kv"]["reserve_output_clip"] = min(data["kv"]["reserve_output_clip"], args.context_limit)
    data["notes"] = (
        f"{args.base} with a {args.kv_tokens}-token KV pool, context limit "
        f"{args.context_limit} and {args.max_running} running requests (scripts/gpu/"
        "real_prompts.sh: four fp32 workers share one GPU; step times are the bf16 ones)."
    )
    Path(args.out).write_text(yaml.safe_dump(data, sort_keys=False))
    return {"profile": args.out}


# -- check -------------------------------------------------------------------------------------
def _post(url: str, body: dict[str, Any], timeout: float) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _bytes_to_id(model_dir: str) -> dict[bytes, int]:
    """Every token's exact bytes (what chat logprobs report) to its id; refuses a vocabulary
    where two ids share bytes (the recovery would then be ambiguous)."""
    from fluidpd.modeldir.model_dir import load_model_dir  # noqa: PLC0415
    from fluidpd.modeldir.text import TokenText  # noqa: PLC0415

    text = TokenText.from_model_dir(load_model_dir(model_dir))
    table: dict[bytes, int] = {}
    for tid in range(text.size):
        raw = text.token_bytes(tid)
        if raw in table:
            raise SystemExit(f"tokens {table[raw]} and {tid} have the same bytes {raw!r}")
        table[raw] = tid
    return table


def _token_id(name: str) -> int:
    """``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids``) to the id; -1 otherwise."""
    head, _, tail = name.partition(":")
    return int(tail) if head == "token_id" and tail.isdigit() else -1


def _request(case: dict[str, Any], model: str, new: int, top: int) -> dict[str, Any]:
    common = {"model": model, "max_tokens": new, "temperature": 0, "ignore_eos": True,
              "return_tokens_as_token_ids": True}  # fmt: skip
    if case["api"] == "chat":
        return {**common, "messages": case["messages"], "logprobs": True, "top_logprobs": top}
    return {**common, "prompt": case["prompt"], "logprobs": top}


def _compare(case: dict[str, Any], status: int, body: dict[str, Any],
             table: dict[bytes, int], decode: Any) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {"name": case["name"], "status": status}
    if status != 200:
        row.update(ok=False, error=body)
        return row
    choice = body["choices"][0]
    want = case["output"]
    row["prompt_tokens"] = body["usage"]["prompt_tokens"]
    row["prompt_tokens_ok"] = row["prompt_tokens"] == len(case["ids"])
    row["completion_tokens"] = body["usage"]["completion_tokens"]
    row["finish_reason"] = choice["finish_reason"]
    lp = choice.get("logprobs") or {}
    if case["api"] == "chat":
        content = lp.get("content") or []
        got = [_token_id(e["token"]) for e in content]
        # Cross-check: the ids also follow from each token's exact bytes.
        row["bytes_ids_ok"] = [table.get(bytes(e["bytes"]), -1) for e in content] == got
        ours = [e["logprob"] for e in content]
        row["text_ok"] = choice["message"]["content"] == decode(want)
    else:
        got = [_token_id(t) for t in lp.get("tokens") or []]
        ours = lp.get("token_logprobs") or []
        row["text_ok"] = choice["text"] == decode(want)
    row["ids"] = got
    row["ids_ok"] = got == want and row.get("bytes_ids_ok", True)
    first = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    row["first_mismatch"] = first if first is not None else (
        None if len(got) == len(want) else min(len(got), len(want)))  # fmt: skip
    if row["first_mismatch"] is not None and row["first_mismatch"] < len(want):
        row["reference_margin_there"] = case["margin"][row["first_mismatch"]]
    upto = row.get("first_mismatch") or len(want)
    diffs = [abs(a - b) for a, b in zip(ours[:upto], case["logprob"][:upto], strict=False)]
    row["max_logprob_diff"] = max(diffs) if diffs else None
    row["ok"] = bool(
        row["prompt_tokens_ok"] and row["text_ok"] and row["ids_ok"]
        and row["completion_tokens"] == len(want) and row["finish_reason"] == "length"
    )  # fmt: skip
    return row


def cmd_check(args: argparse.Namespace) -> dict[str, Any]:
    from fluidpd.modeldir.model_dir import load_model_dir  # noqa: PLC0415
    from fluidpd.modeldir.text import TokenText  # noqa: PLC0415

    ref = json.loads(Path(args.ref).read_text())
    base = args.endpoint.rstrip("/")
    with urllib.request.urlopen(f"{base}/v1/models", timeout=30) as resp:
        model = json.loads(resp.read())["data"][0]["id"]
    table = _bytes_to_id(args.model_dir)
    text = TokenText.from_model_dir(load_model_dir(args.model_dir))
    cases = ref["cases"]
    urls = {"chat": f"{base}/v1/chat/completions", "completions": f"{base}/v1/completions"}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(cases)) as pool:  # concurrently: they share decode batches
        answers = list(pool.map(
            lambda c: _post(urls[c["api"]], _request(c, model, ref["new_tokens"], 5),
                            args.timeout), cases))  # fmt: skip
    rows = [_compare(c, s, b, table, text.decode) for c, (s, b) in zip(cases, answers, strict=True)]
    seeded_case = next(c for c in cases if c["api"] == "chat")
    seeded = {**_request(seeded_case, model, ref["new_tokens"], 1), "temperature": 0.8,
              "top_p": 0.95, "seed": 1234}  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        twice = list(pool.map(lambda _: _post(urls["chat"], seeded, args.timeout), range(2)))
    seeded_ids = [
        [_token_id(e["token"]) for e in b["choices"][0]["logprobs"]["content"]]
        if s == 200 else None
        for s, b in twice
    ]  # fmt: skip
    seed_row = {
        "status": [s for s, _ in twice],
        "same": seeded_ids[0] is not None and seeded_ids[0] == seeded_ids[1],
        "differs_from_greedy": seeded_ids[0] != seeded_case["output"],
    }
    return {
        "model": model,
        "dtype": ref["dtype"],
        "requests_s": time.perf_counter() - t0,
        "rows": rows,
        "seeded": seed_row,
        "all_ok": all(r["ok"] for r in rows) and seed_row["same"],
    }


# -- summary -----------------------------------------------------------------------------------
def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def cmd_summary(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    report: dict[str, Any] = {"argv": args.argv, "steps": {}}
    for name in ("model", "reference", "profile", "check"):
        report["steps"][name] = _read(work / f"{name}.json")
    benches = [b for p in sorted(work.glob("bench-*.json")) if (b := _read(p)) is not None]
    report["bench"] = benches
    lines = []
    check = report["steps"]["check"]
    if check:
        for r in check["rows"]:
            lines.append(
                f"{r['name']:>13}: ok={r['ok']} ids_ok={r.get('ids_ok')} "
                f"text_ok={r.get('text_ok')} first_mismatch={r.get('first_mismatch')} "
                f"max|dlogprob|={r.get('max_logprob_diff')}"
            )
        lines.append(
            f"({check['dtype']}) seeded twice equal: {check['seeded']['same']}; "
            f"all ok: {check['all_ok']}"
        )
    else:
        lines.append("check: no result (see the log)")
    by_label: dict[str, list[dict[str, Any]]] = {}
    for b in benches:
        by_label.setdefault(b["label"], []).append(b)
    for label, runs in by_label.items():
        dec = [r["decode_step_s"] * 1e3 for r in runs]
        pre = [r["prefill_s"] * 1e3 for r in runs]
        smp = [r["decode_step_sampled_s"] * 1e3 for r in runs if "decode_step_sampled_s" in r]
        lines.append(
            f"bench {label}: decode b{runs[0]['decode_batch']}@{runs[0]['decode_context']} "
            f"{', '.join(f'{v:.2f}' for v in dec)} ms; prefill {runs[0]['prefill_tokens']} "
            f"{', '.join(f'{v:.1f}' for v in pre)} ms"
            + (f"; sampled decode {', '.join(f'{v:.2f}' for v in smp)} ms" if smp else "")
        )
    report["summary"] = lines
    _save(args.out, report)
    print("\n".join(lines))
    ok = bool(check and check["all_ok"])
    return {"ok": ok}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("model", help="write the model directory")
    p.add_argument("--out", required=True, help="the directory")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--vocab", type=int, default=None, help="--tiny: pad the vocabulary to this")
    p.add_argument("--device", default="cuda")
    p = sub.add_parser("reference", help="transformers generate")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--new", type=int, default=32)
    p = sub.add_parser("profile", help="a small-pool serving profile")
    p.add_argument("--base", required=True)
    p.add_argument("--out", required=True, help="the profile YAML")
    p.add_argument("--kv-tokens", type=int, default=4096)
    p.add_argument("--context-limit", type=int, default=512)
    p.add_argument("--max-running", type=int, default=16)
    p = sub.add_parser("check", help="the live stack against the reference")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--timeout", type=float, default=300.0)
    p = sub.add_parser("summary", help="merge and print")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True, help="the merged JSON")
    for q in sub.choices.values():
        q.add_argument("--json", default=None, help="write this step's result here")
    args = ap.parse_args(argv)
    args.argv = sys.argv
    fn = {"model": cmd_model, "reference": cmd_reference, "profile": cmd_profile,
          "check": cmd_check, "summary": cmd_summary}[args.cmd]  # fmt: skip
    result = fn(args)
    if args.json:
        _save(args.json, result)
    if args.cmd == "check":
        print(json.dumps({"all_ok": result["all_ok"], "seeded": result["seeded"]}))
    return 0 if result.get("ok", result.get("all_ok", True)) else 1


if __name__ == "__main__":
    sys.exit(main())
