"""A model directory's ``*.safetensors`` weights, checked from their headers alone.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (each tensor's
name to ``{"dtype", "shape", "data_offsets": [begin, end]}``, plus an optional
``"__metadata__"``), then the tensors' bytes: offsets count from the end of the header, the
tensors tile the data without gaps, and the file ends where the last one does (8 + N + the
largest end). ``check_weights`` checks exactly that, as the safetensors library does when it
opens a file, in pure Python (no torch, no safetensors package): a few KB read per file, so a
100 GB checkpoint is checked in milliseconds. A truncated download, a missing shard or a file
that is not safetensors at all is then one ``ModelDirError`` line naming the file, before an
engine spends minutes starting (SGLang fails in its loader only after it initialised).

The weight files are those ``model.safetensors.index.json`` names when it exists (SGLang and
transformers load only those), else every ``*.safetensors`` in the directory. The tensors'
names and shapes against ``config.json`` are the engine's to check (the gpu engine's
``checkpoint.py``; SGLang's model classes).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any, TypeGuard

from fluidpd.modeldir.model_dir import ModelDirError

INDEX = "model.safetensors.index.json"
#: The safetensors library refuses larger headers (its ``MAX_HEADER_SIZE``).
MAX_HEADER = 100_000_000
#: Bits per element of the dtypes safetensors knows; a dtype not listed is not size-checked.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "I64": 64, "U64": 64, "F64": 64,
}  # fmt: skip


def index_weight_map(root: Path) -> dict[str, Path] | None:
    """Which file holds each tensor, as ``model.safetensors.index.json`` says; None without one."""
    index = root / INDEX
    if not index.is_file():
        return None
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return {str(k): root / str(v) for k, v in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelDirError(f"{index}: not a safetensors index ({exc!r})") from None


def has_safetensors(root: Path) -> bool:
    """Whether ``root`` keeps its weights as safetensors (an index or any ``*.safetensors``)."""
    return (root / INDEX).is_file() or any(root.glob("*.safetensors"))


def weight_files(root: Path) -> list[Path]:
    """The files that hold the weights: the index's (each must exist), else ``*.safetensors``."""
    where = index_weight_map(root)
    if where is None:
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise ModelDirError(f"{root}: no *.safetensors weights (and no {INDEX})")
        return files
    files = sorted(set(where.values()))
    if not files:
        raise ModelDirError(f"{root / INDEX}: its weight_map names no file")
    for path in files:
        if not path.is_file():
            raise ModelDirError(f"{path}: missing (named by {INDEX})")
    return files


def _sizes(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    )


def _tensor_bytes(name: str, info: Any) -> tuple[int, int, int | None]:
    """A header entry's ``(begin, end, bytes its dtype and shape take)``; ValueError if bad."""
    if not isinstance(info, dict):
        raise ValueError(f"tensor {name}: expected an object, got {type(info).__name__}")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise ValueError(f"tensor {name}: dtype missing")
    if not _sizes(shape):
        raise ValueError(f"tensor {name}: shape {shape!r} is not a list of sizes")
    if not _sizes(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise ValueError(f"tensor {name}: data_offsets {offsets!r} is not [begin, end]")
    bits = DTYPE_BITS.get(dtype)
    return offsets[0], offsets[1], None if bits is None else math.prod(shape) * bits // 8


def check_file(path: Path) -> None:
    """One safetensors file's header, and that the file is as long as its header says."""
    bad = f"{path}: not a valid safetensors file"
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            if size < 8:
                raise ModelDirError(f"{bad}: {size} bytes, too short for a header")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ModelDirError(f"{bad}: header says {n} bytes, the file has {size}")
            if n > MAX_HEADER:
                raise ModelDirError(f"{bad}: header says {n} bytes, over the {MAX_HEADER} limit")
            raw = f.read(n)
    except OSError as exc:
        raise ModelDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelDirError(f"{bad}: its {n}-byte header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ModelDirError(f"{bad}: its header is not a JSON object")
    spans = []
    try:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end, want = _tensor_bytes(name, info)
            if want is not None and end - begin != want:
                raise ValueError(
                    f"tensor {name}: {info['dtype']} {info['shape']} takes {want} bytes, "
                    f"data_offsets give {end - begin}"
                )
            spans.append((begin, end, name))
    except ValueError as exc:
        raise ModelDirError(f"{bad}: {exc}") from None
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise ModelDirError(
                f"{bad}: tensor {name} starts at data byte {begin}, the previous ends at {at}"
            )
        at = end
    if 8 + n + at != size:
        cause = "truncated" if size < 8 + n + at else "trailing bytes"
        raise ModelDirError(
            f"{bad}: its header and tensors take {8 + n + at} bytes, the file has {size} ({cause})"
        )


def check_weights(model_dir: str | Path) -> None:
    """Every weight file of ``model_dir`` exists and is a whole safetensors file (see above)."""
    for path in weight_files(Path(model_dir).expanduser()):
        check_file(path)
