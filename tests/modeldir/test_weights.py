"""A model directory's safetensors weights checked from their headers (``check_weights``): whole
files pass, sharded or not; a truncated, foreign or missing file is one line naming it; the
check refuses what the safetensors library refuses; ``fluidpd sidecar --engine sglang`` runs it
before SGLang is spawned, unless SGLang reads no weights (``--sglang-load-format dummy``)."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from fluidpd.cli.main import main
from fluidpd.modeldir.model_dir import ModelDirError
from fluidpd.modeldir.weights import INDEX, check_weights

BAD = "not a valid safetensors file"


def write_safetensors(path: Path, header: dict[str, Any], data: int | None = None) -> Path:
    """A file of ``header`` (dtype and shape per tensor; offsets laid out one after the other
    unless given) and ``data`` zero bytes (default: what the offsets cover)."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "U8": 1}
    out: dict[str, Any] = {}
    at = 0
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict) or "data_offsets" in info:
            out[name] = info
            continue
        n = math.prod(info["shape"]) * sizes[info["dtype"]]
        out[name] = {**info, "data_offsets": [at, at + n]}
        at += n
    if data is None:
        data = max((v["data_offsets"][1] for k, v in out.items() if k != "__metadata__"), default=0)
    raw = json.dumps(out).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data)
    return path


TWO = {
    "__metadata__": {"format": "pt"},
    "a.weight": {"dtype": "F32", "shape": [4, 8]},
    "b.weight": {"dtype": "BF16", "shape": [3]},
}


def one_line(exc: pytest.ExceptionInfo[ModelDirError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def copy(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(src, out)
    return out


def test_a_single_file_checkpoint_passes(tiny_llama_dir: Path) -> None:
    assert (tiny_llama_dir / "model.safetensors").is_file()
    assert not (tiny_llama_dir / INDEX).exists()
    check_weights(tiny_llama_dir)
    check_weights(str(tiny_llama_dir))


def test_a_sharded_checkpoint_passes_and_only_the_index_files_count(
    tiny_qwen3_dir: Path, tmp_path: Path
) -> None:
    assert len(list(tiny_qwen3_dir.glob("model-*.safetensors"))) > 1
    check_weights(tiny_qwen3_dir)
    d = copy(tiny_qwen3_dir, tmp_path)
    # A file the index does not name is not loaded (SGLang, transformers): not checked either.
    (d / "consolidated.safetensors").write_bytes(b"junk")
    check_weights(d)


def test_a_truncated_file_is_named(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    d = copy(tiny_qwen3_dir, tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[1]
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ModelDirError) as exc:
        check_weights(d)
    assert one_line(exc) == (
        f"{shard}: {BAD}: its header and tensors take {size} bytes, the file has {size - 100} "
        "(truncated)"
    )


def test_a_header_length_beyond_the_file_is_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    d = copy(tiny_llama_dir, tmp_path)
    weights = d / "model.safetensors"
    raw = weights.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n > 1000 - 8
    weights.write_bytes(raw[:1000])  # the start failure tests/sglang checks end to end
    with pytest.raises(ModelDirError) as exc:
        check_weights(d)
    assert one_line(exc) == f"{weights}: {BAD}: header says {n} bytes, the file has 1000"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "0 bytes, too short for a header"),
        (b"\x01\x02", "2 bytes, too short for a header"),
        (
            b"PK\x03\x04 a zip, say a pytorch_model.bin" * 10,
            "header says 8800140462016121680 bytes, the file has 350",
        ),
        (struct.pack("<Q", 12) + b"not json!!!!", "its 12-byte header is not JSON"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "its 4-byte header is not JSON"),
        (struct.pack("<Q", 2) + b"[]", "its header is not a JSON object"),
    ],
)
def test_a_garbage_header_is_named(content: bytes, says: str, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(ModelDirError) as exc:
        check_weights(tmp_path)
    assert one_line(exc).startswith(f"{path}: {BAD}: {says}")


def test_a_missing_shard_is_named(tiny_qwen3_dir: Path, tmp_path: Path) -> None:
    d = copy(tiny_qwen3_dir, tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[2]
    shard.unlink()
    with pytest.raises(ModelDirError) as exc:
        check_weights(d)
    assert one_line(exc) == f"{shard}: missing (named by {INDEX})"


def test_no_weights_at_all(tiny_llama_dir: Path, tmp_path: Path) -> None:
    d = copy(tiny_llama_dir, tmp_path)
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelDirError) as exc:
        check_weights(d)
    assert one_line(exc) == f"{d}: no *.safetensors weights (and no {INDEX})"


def test_a_bad_index_is_named(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model.safetensors", TWO)
    (tmp_path / INDEX).write_text('{"metadata": {}}')
    with pytest.raises(ModelDirError) as exc:
        check_weights(tmp_path)
    assert one_line(exc).startswith(f"{tmp_path / INDEX}: not a safetensors index (KeyError(")
    (tmp_path / INDEX).write_text('{"weight_map": {}}')
    with pytest.raises(ModelDirError, match="its weight_map names no file"):
        check_weights(tmp_path)


#: Headers the safetensors library refuses too, and what the check says.
CORRUPT: list[tuple[str, dict[str, Any], int | None, str]] = [
    ("size mismatch", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, None,
     "tensor a: F32 [2] takes 8 bytes, data_offsets give 4"),
    ("gap", {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
             "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}, None,
     "tensor b starts at data byte 4, the previous ends at 2"),
    ("overlap", {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                 "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}, None,
     "tensor b starts at data byte 2, the previous ends at 4"),
    ("reversed offsets", {"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}}, 4,
     "tensor a: data_offsets [4, 0] is not [begin, end]"),
    ("no shape", {"a": {"dtype": "U8", "data_offsets": [0, 1]}}, None,
     "tensor a: shape None is not a list of sizes"),
    ("not an object", {"a": [1, 2]}, 0, "tensor a: expected an object, got list"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("header", "data", "says"), [c[1:] for c in CORRUPT], ids=[c[0] for c in CORRUPT]
)
def test_what_safetensors_refuses_is_refused(
    header: dict[str, Any], data: int | None, says: str, tmp_path: Path
) -> None:
    path = write_safetensors(tmp_path / "model.safetensors", header, data)
    with pytest.raises(ModelDirError) as exc:
        check_weights(tmp_path)
    assert one_line(exc) == f"{path}: {BAD}: {says}"
    safetensors = pytest.importorskip("safetensors")
    with pytest.raises(Exception, match=r"(?i)invalid|incomplete|metadata|offset|deserializ"):
        safetensors.safe_open(str(path), framework="numpy")


def test_trailing_bytes_are_refused(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "model.safetensors", TWO, data=32 * 4 + 3 * 2 + 5)
    size = path.stat().st_size
    with pytest.raises(ModelDirError) as exc:
        check_weights(tmp_path)
    assert one_line(exc) == (
        f"{path}: {BAD}: its header and tensors take {size - 5} bytes, the file has {size} "
        "(trailing bytes)"
    )
    safetensors = pytest.importorskip("safetensors")
    with pytest.raises(Exception, match=r"(?i)metadata|incomplete"):
        safetensors.safe_open(str(path), framework="numpy")


def test_what_safetensors_reads_passes(tmp_path: Path) -> None:
    header = {
        **TWO,
        "empty": {"dtype": "I64", "shape": [0, 5]},
        "scalar": {"dtype": "F16", "shape": []},
    }
    path = write_safetensors(tmp_path / "model.safetensors", header)
    check_weights(tmp_path)
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert sorted(f.keys()) == ["a.weight", "b.weight", "empty", "scalar"]


def test_sglang_sidecar_refuses_bad_weights_before_starting_sglang(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = copy(tiny_llama_dir, tmp_path)
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1])
    argv = ["sidecar", "--id", "w0", "--role", "decode", "--engine", "sglang", "--device", "cpu"]
    argv += ["--model-dir", str(d), "--sglang-python", str(tmp_path / "no-python")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fluidpd: error: --model-dir: {weights}: {BAD}: its header and ")
    assert len(err.splitlines()) == 1 and err.endswith("(truncated)")
    # SGLang reads no weights: the next check (its interpreter) is what fails.
    for fmt in ("dummy", "pt"):
        assert main([*argv, "--sglang-load-format", fmt]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("fluidpd: error: --sglang-python: "), err
    assert main([*argv, "--sglang-load-format", "safetensors"]) == 2
    assert f"{weights}: {BAD}" in capsys.readouterr().err


def test_sglang_auto_format_leaves_pytorch_checkpoints_to_sglang(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SGLang's ``auto`` loader falls back to ``*.bin`` weights: FluidPD does not refuse them."""
    d = copy(tiny_llama_dir, tmp_path)
    (d / "model.safetensors").unlink()
    argv = ["sidecar", "--id", "w0", "--role", "decode", "--engine", "sglang", "--device", "cpu"]
    argv += ["--model-dir", str(d), "--sglang-python", str(tmp_path / "no-python")]
    assert main(argv) == 2  # nothing to load at all
    assert f"{d}: no *.safetensors weights" in capsys.readouterr().err
    (d / "pytorch_model.bin").write_bytes(b"PK\x03\x04")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fluidpd: error: --sglang-python: "), err  # the weights passed
    assert main([*argv, "--sglang-load-format", "safetensors"]) == 2
    assert f"{d}: no *.safetensors weights" in capsys.readouterr().err
