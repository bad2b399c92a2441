"""`--device` is checked before the engine is built: one line that says what is wrong."""

from __future__ import annotations

import pytest
import torch

from fluidpd_sidecar.gpu.device import check_device


def test_cpu_is_always_usable() -> None:
    assert check_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize(
    ("text", "why"),
    [("cuda:x", "is not a torch device"), ("gpu0", "is not a torch device"),
     ("mps", "runs on cuda or cpu"), ("meta", "runs on cuda or cpu")],
)  # fmt: skip
def test_bad_devices_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_device(text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu_points_to_cpu() -> None:
    with pytest.raises(ValueError, match=r"no CUDA device here \(use --device cpu\)"):
        check_device("cuda:0")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_index_past_the_last_device_is_named() -> None:
    n = torch.cuda.device_count()
    assert check_device(f"cuda:{n - 1}").index == n - 1
    with pytest.raises(ValueError, match=f"has {n} CUDA device"):
        check_device(f"cuda:{n}")
