"""Loading a model directory: what is read, and one line naming the file when it is wrong."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fluidpd.cli.main import main
from fluidpd.modeldir.embedded import EMBEDDED_DIR, resolve_model_dir, write_embedded
from fluidpd.modeldir.model_dir import ModelDirError, load_model_dir
from fluidpd.modeldir.text import TokenText

transformers = pytest.importorskip("transformers")


def test_a_synthetic_checkpoint_loads(tiny_llama_dir: Path) -> None:
    md = load_model_dir(tiny_llama_dir)
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    gen = json.loads((tiny_llama_dir / "generation_config.json").read_text())
    assert list(md.eos_token_ids) == gen["eos_token_id"]
    assert tok.convert_ids_to_tokens(list(md.eos_token_ids)) == ["<|eot_id|>", "<|end_of_text|>"]
    assert md.architecture == "LlamaForCausalLM"
    assert md.vocab_size == json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]
    assert md.chat_template == tok.chat_template
    assert md.context_limit(1 << 20) == 4096 and md.context_limit(100) == 100


def test_the_embedded_default_is_current_and_loads(tmp_path: Path) -> None:
    """The shipped files are what ``write_embedded`` writes today, byte for byte."""
    write_embedded(tmp_path)
    shipped = sorted(p.name for p in EMBEDDED_DIR.iterdir())
    assert shipped == sorted(p.name for p in tmp_path.iterdir())
    for name in shipped:
        assert (EMBEDDED_DIR / name).read_bytes() == (tmp_path / name).read_bytes(), name
    md = resolve_model_dir(None)
    assert md.path == EMBEDDED_DIR and md.vocab_size == 1024 and md.chat_template
    text = TokenText.from_model_dir(md)
    assert 600 < len(text.text_ids()) < len(text.ordinary_ids())


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    return dst


BROKEN: list[tuple[str, Callable[[Path], None], str]] = [
    ("config.json", lambda d: (d / "config.json").unlink(), "config.json: missing"),
    ("config.json", lambda d: (d / "config.json").write_text("{oops"), "not valid JSON"),
    ("config.json", lambda d: (d / "config.json").write_text("[1]"), "expected a JSON object"),
    ("tokenizer.json", lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json: missing"),
    (
        "tokenizer_config.json",
        lambda d: (d / "tokenizer_config.json").unlink(),
        "tokenizer_config.json: missing",
    ),
    (
        "generation_config.json",
        lambda d: (d / "generation_config.json").write_text('{"eos_token_id": "x"}'),
        "generation_config.json: eos_token_id",
    ),
    (
        "generation_config.json",
        lambda d: (d / "generation_config.json").write_text('{"eos_token_id": [99999]}'),
        ">= vocab_size",
    ),
]


@pytest.mark.parametrize(("name", "breaks", "needle"), BROKEN)
def test_a_broken_directory_names_the_file(
    tiny_llama_dir: Path,
    tmp_path: Path,
    name: str,
    breaks: Callable[[Path], None],
    needle: str,
) -> None:
    d = _copy(tiny_llama_dir, tmp_path / "m")
    breaks(d)
    with pytest.raises(ModelDirError) as err:
        load_model_dir(d)
    message = str(err.value)
    assert "\n" not in message and name in message and needle in message


def test_eos_falls_back_to_config_json(tiny_llama_dir: Path, tmp_path: Path) -> None:
    d = _copy(tiny_llama_dir, tmp_path / "m")
    (d / "generation_config.json").unlink()
    assert load_model_dir(d).eos_token_ids == load_model_dir(tiny_llama_dir).eos_token_ids
    cfg = json.loads((d / "config.json").read_text())
    del cfg["eos_token_id"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelDirError, match=r"generation_config\.json: no eos_token_id"):
        load_model_dir(d)


def test_a_corrupt_tokenizer_is_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    d = _copy(tiny_llama_dir, tmp_path / "m")
    (d / "tokenizer.json").write_text('{"version": "1.0"}')
    with pytest.raises(ModelDirError, match=r"tokenizer\.json: cannot be loaded"):
        TokenText.from_model_dir(load_model_dir(d))


def test_a_chat_template_file_beside_the_config_is_used(
    tiny_qwen3_dir: Path, tmp_path: Path
) -> None:
    d = _copy(tiny_qwen3_dir, tmp_path / "m")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    template = cfg.pop("chat_template")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert load_model_dir(d).chat_template is None  # a base model: completions only
    (d / "chat_template.jinja").write_text(template)
    assert load_model_dir(d).chat_template == template


def test_hub_ids_and_missing_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="hub ids are not downloaded"):
        load_model_dir("meta-llama/Llama-3.1-8B-Instruct")
    with pytest.raises(ModelDirError, match="no such directory"):
        load_model_dir(tmp_path / "nothing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelDirError, match="not a directory"):
        load_model_dir(tmp_path / "file")


@pytest.mark.parametrize("command", ["sidecar", "router", "up"])
def test_cli_refuses_a_bad_model_dir_in_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = {"sidecar": ["--id", "w0", "--role", "prefill"], "up": ["--run-dir", str(tmp_path)]}
    code = main([command, *extra.get(command, []), "--model-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "--model-dir" in err and "config.json: missing" in err
