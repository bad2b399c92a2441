"""``DeviceView``: bytes of a GPU arena, where the host transports hand out a ``memoryview``.

The sidecar and the engines pass a transport's ``view`` around without looking inside, except
for two small things the sidecar does with the bytes itself: it writes a ``sim`` engine's stamp
(``view[:8] = stamp``) and reads it back to check that the right request's KV arrived
(``bytes(view[:8])``). A ``DeviceView`` does both with a tiny host copy; the ``gpu`` engine reads
and writes its ``tensor`` directly, on the device. torch is imported only when a view is used,
so the module imports anywhere.

Those small copies run on a side stream of their own: on the default stream they would queue
behind the decode step the engine's thread has in flight, and the event loop (which checks a
hand-off's stamp) would stall for the rest of that step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_SIDE: dict[Any, Any] = {}


def _side_stream(device: torch.device) -> Any:
    import torch  # noqa: PLC0415 - see the module's docstring

    stream = _SIDE.get(device)
    if stream is None:
        stream = _SIDE[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    return stream


class DeviceView:
    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        if tensor.dim() != 1 or tensor.element_size() != 1:
            raise ValueError("a DeviceView is a 1-D tensor of bytes")
        self.tensor = tensor

    def __len__(self) -> int:
        return int(self.tensor.numel())

    def __bytes__(self) -> bytes:
        import torch  # noqa: PLC0415

        if not self.tensor.is_cuda:
            return bytes(self.tensor.numpy().tobytes())
        with torch.cuda.stream(_side_stream(self.tensor.device)):
            host = self.tensor.cpu()  # waits for this copy, not for the engine's step
        return bytes(host.numpy().tobytes())

    def __getitem__(self, key: slice) -> DeviceView:
        return DeviceView(self.tensor[key])

    def __setitem__(self, key: slice, value: bytes) -> None:
        import torch  # noqa: PLC0415 - see the module's docstring

        target = self.tensor[key]
        if len(value) != target.numel():
            raise ValueError(f"{len(value)} bytes for a slice of {target.numel()}")
        if not value:
            return
        src = torch.frombuffer(bytearray(value), dtype=torch.uint8)
        if not target.is_cuda:
            target.copy_(src)
            return
        stream = _side_stream(target.device)
        with torch.cuda.stream(stream):
            target.copy_(src)
        stream.synchronize()
