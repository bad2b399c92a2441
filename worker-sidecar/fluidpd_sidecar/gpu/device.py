"""The ``--device`` check: a bad or absent device is one line naming it, before any weights or
KV pool are built (torch's own errors arrive as tracebacks from deep inside the runner)."""

from __future__ import annotations

import torch


def check_device(text: str) -> torch.device:
    """``text`` as a torch device this process can use; ValueError says why not."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(f"{text!r} is not a torch device (cuda, cuda:N or cpu)") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"{text!r}: the gpu engine runs on cuda or cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError(f"{text!r}: torch sees no CUDA device here (use --device cpu)")
    if device.index is not None and device.index >= count:
        raise ValueError(f"{text!r}: this machine has {count} CUDA device(s), cuda:0..{count - 1}")
    return device
