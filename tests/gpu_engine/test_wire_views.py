"""The KV wire format over a device arena's ``DeviceView`` (the ``cuda-ipc`` transport's
bytes) is byte for byte the format over a host ``memoryview``: the views here are over CPU
tensors (no CUDA on this machine), the code path the one a GPU arena takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fluidpd_sidecar.device_view import DeviceView
from fluidpd_sidecar.engine import kv_stamp
from fluidpd_sidecar.gpu import wire


def test_a_device_view_carries_the_same_bytes_as_a_host_view() -> None:
    kv = torch.randn(3, 2, 17, 2, 8, dtype=torch.bfloat16)
    n = wire.HEADER + kv.numel() * kv.element_size()
    host = np.zeros(n + 64, dtype=np.uint8)
    dev = DeviceView(torch.zeros(n + 64, dtype=torch.uint8))
    assert wire.write(host.data, 42, 7, kv) == wire.write(dev, 42, 7, kv) == n
    assert bytes(dev) == host.tobytes()
    assert bytes(dev[:8]) == kv_stamp(42)
    head = wire.read_header(dev)
    assert head == wire.read_header(host.data)
    assert (head.rid, head.tokens, head.first_token, head.layers) == (42, 17, 7, 3)
    assert torch.equal(wire.payload(dev, head, torch.bfloat16), kv)


def test_buffers_too_small_for_their_kv_are_refused() -> None:
    kv = torch.zeros(1, 2, 4, 1, 8)
    small = DeviceView(torch.zeros(wire.HEADER + 10, dtype=torch.uint8))
    with pytest.raises(ValueError, match="do not fit"):
        wire.write(small, 1, -1, kv)
    with pytest.raises(ValueError, match="bytes for a slice"):
        small[:8] = b"123"
    with pytest.raises(ValueError, match="1-D tensor of bytes"):
        DeviceView(torch.zeros(4))
