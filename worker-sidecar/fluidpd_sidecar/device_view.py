"""``DeviceView``: bytes of a GPU arena, where the host transports hand out a ``memoryview``.

The sidecar and the engines pass a transport's ``view`` around without looking inside, except
for two small things the sidecar does with the bytes itself: it writes a ``sim`` engine's stamp
(``view[:8] = stamp``) and reads it back to check that the right request's KV arrived
(``bytes(view[:8])``). A ``DeviceView`` does both with a tiny host copy; the ``gpu`` engine reads
and writes its ``tensor`` directly, on the device. torch is imported only when a view is used,
so the module imports anywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class DeviceView:
    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        if tensor.dim() != 1 or tensor.element_size() != 1:
            raise ValueError("a DeviceView is a 1-D tensor of bytes")
        self.tensor = tensor

    def __len__(self) -> int:
        return int(self.tensor.numel())

    def __bytes__(self) -> bytes:
        return bytes(self.tensor.cpu().numpy().tobytes())

    def __getitem__(self, key: slice) -> DeviceView:
        return DeviceView(self.tensor[key])

    def __setitem__(self, key: slice, value: bytes) -> None:
        import torch  # noqa: PLC0415 - see the module's docstring

        target = self.tensor[key]
        if len(value) != target.numel():
            raise ValueError(f"{len(value)} bytes for a slice of {target.numel()}")
        if value:
            target.copy_(torch.frombuffer(bytearray(value), dtype=torch.uint8))
