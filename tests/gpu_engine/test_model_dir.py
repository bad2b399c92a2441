"""A Hugging Face model directory into the gpu engine: the shape from ``config.json`` (either
rope layout), the weights from one or sharded safetensors files, and every way a directory can
be wrong as one line naming the file (and the tensor or field)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from fluidpd.modeldir.model_dir import ModelDirError
from fluidpd_sidecar.gpu.checkpoint import model_dir_config
from fluidpd_sidecar.gpu.config import SHAPES, from_hf_config
from fluidpd_sidecar.gpu.runner import ModelRunner, RunnerOptions

transformers = pytest.importorskip("transformers")

OPTS = RunnerOptions(device="cpu", dtype="float32", kv_tokens=1024, max_context=256, max_batch=4)


def runner(model_dir: Path, dtype: str = "float32") -> ModelRunner:
    opts = RunnerOptions(
        device="cpu", dtype=dtype, kv_tokens=1024, max_context=256, max_batch=4,
        model_dir=str(model_dir),
    )  # fmt: skip
    return ModelRunner(model_dir_config(model_dir), opts)


def copy(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(src, out)
    return out


def edit_config(model_dir: Path, **changes: Any) -> None:
    path = model_dir / "config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def one_line(exc: pytest.ExceptionInfo[ModelDirError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen3_dir"])
def test_a_model_directory_computes_what_transformers_computes(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    ours = runner(model_dir)
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = [(7 * i + 3) % ours.cfg.vocab for i in range(70)]
    with torch.inference_mode():
        want = ref(torch.tensor([ids])).logits[0, -1]
    got = ours.prefill(1, ids)
    assert float((got - want).abs().max()) < 1e-4 * float(want.abs().max())
    tied = ours.cfg.tie_embeddings
    assert tied == (fixture == "tiny_qwen3_dir")
    assert (ours.weights.lm_head.data_ptr() == ours.weights.embed.data_ptr()) == tied


def test_bf16_weights_on_cpu(tiny_llama_dir: Path) -> None:
    r = runner(tiny_llama_dir, "bfloat16")
    assert r.weights.embed.dtype == torch.bfloat16
    assert torch.isfinite(r.prefill(1, [1, 2, 3])).all()


def test_the_old_rope_scaling_layout_reads_the_same(tiny_llama_dir: Path, tmp_path: Path) -> None:
    new = from_hf_config(tiny_llama_dir / "config.json")
    d = copy(tiny_llama_dir, tmp_path)
    data = json.loads((d / "config.json").read_text())
    rope = data.pop("rope_parameters")
    data["rope_theta"] = rope.pop("rope_theta")
    data["rope_scaling"] = rope
    (d / "config.json").write_text(json.dumps(data))
    assert from_hf_config(d / "config.json", name=new.name) == new
    assert new.rope_theta == 500000.0 and new.rope_scaling is not None


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"architectures": ["MistralForCausalLM"]},
         "architecture MistralForCausalLM is not supported by the gpu engine"),
        ({"architectures": None}, "architecture none given is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
         "rope_type 'yarn' is not supported"),
        ({"hidden_size": None}, "missing field 'hidden_size'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' (only silu) is not supported"),
        ({"attention_bias": True}, "attention_bias: true is not supported"),
    ],
)  # fmt: skip
def test_bad_config_is_one_line_naming_config_json(
    tiny_llama_dir: Path, tmp_path: Path, changes: dict[str, Any], says: str
) -> None:
    d = copy(tiny_llama_dir, tmp_path)
    edit_config(d, **changes)
    with pytest.raises(ModelDirError) as exc:
        model_dir_config(d)
    assert str(d / "config.json") in one_line(exc) and says in str(exc.value)


def test_no_config_json(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match=r"config\.json: missing"):
        model_dir_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelDirError, match=r"config\.json: not valid JSON"):
        model_dir_config(tmp_path)


def test_a_missing_shard_is_named(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    d = copy(tiny_qwen3_dir, tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[2]
    shard.unlink()
    with pytest.raises(ModelDirError) as exc:
        runner(d)
    assert f"{shard}: missing (named by model.safetensors.index.json)" == one_line(exc)


def test_a_corrupt_file_is_named(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    d = copy(tiny_qwen3_dir, tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    with pytest.raises(ModelDirError) as exc:
        runner(d)
    assert one_line(exc).startswith(f"{shard}: not a valid safetensors file")


def test_a_shape_mismatch_names_the_file_and_tensor(tiny_llama_dir: Path, tmp_path: Path) -> None:
    d = copy(tiny_llama_dir, tmp_path)
    edit_config(d, intermediate_size=192)
    with pytest.raises(ModelDirError) as exc:
        runner(d)
    text = one_line(exc)
    assert text.startswith(f"{d / 'model.safetensors'}: tensor model.layers.0.mlp.")
    assert "has shape [128, 64], config.json implies [192, 64]" in text


def test_a_missing_tensor_and_an_extra_layer_are_named(
    tiny_qwen3_dir: Path, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    d = copy(tiny_qwen3_dir, tmp_path)
    index = d / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    del data["weight_map"]["model.layers.1.self_attn.k_norm.weight"]
    index.write_text(json.dumps(data))
    with pytest.raises(ModelDirError) as exc:
        runner(d)
    assert "tensor model.layers.1.self_attn.k_norm.weight is in no safetensors file" in one_line(
        exc
    )
    d2 = tmp_path / "fewer"
    shutil.copytree(tiny_llama_dir, d2)
    edit_config(d2, num_hidden_layers=1)
    with pytest.raises(ModelDirError) as exc:
        runner(d2)
    assert "unexpected tensor model.layers.1." in one_line(exc)


def test_no_weights_at_all(tiny_llama_dir: Path, tmp_path: Path) -> None:
    d = copy(tiny_llama_dir, tmp_path)
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelDirError, match=r"no \*\.safetensors weights"):
        runner(d)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shape_round_trips_through_config_json(name: str, tmp_path: Path) -> None:
    cfg = SHAPES[name]
    arch = "Qwen3ForCausalLM" if cfg.qk_norm else "LlamaForCausalLM"
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": [arch], **cfg.to_hf_config()}))
    assert from_hf_config(path, name=name) == cfg
