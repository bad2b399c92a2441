"""A paged KV cache that the engine manages itself (vLLM/SGLang-style pages, no library).

One tensor holds every layer's K and V: ``[layers, 2, pages, page_size, kv_heads, head_dim]``.
Requests own lists of pages (their page table); page 0 is a scratch page that padded rows of
a CUDA-graph batch write into, so a graph can always run at its bucket size. Pages, not one
contiguous slot per request, because the decode side reserves prompt + clipped output and a
slot per request would strand most of that memory.
"""

from __future__ import annotations

import torch

from fluidpd_sidecar.gpu.config import ModelConfig

SCRATCH_PAGE = 0


class KVCacheFull(MemoryError):
    """No free pages for a request's next tokens."""


class PagedKVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        capacity_tokens: int,
        page_size: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.cfg = cfg
        self.page_size = page_size
        self.num_pages = -(-capacity_tokens // page_size) + 1  # + scratch
        shape = (cfg.layers, 2, self.num_pages, page_size, cfg.kv_heads, cfg.head_dim)
        self.kv = torch.zeros(shape, device=device, dtype=dtype)
        self._free: list[int] = list(range(self.num_pages - 1, SCRATCH_PAGE, -1))
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def capacity_tokens(self) -> int:
        return (self.num_pages - 1) * self.page_size

    def ensure(self, rid: int, tokens: int) -> None:
        """Give ``rid`` pages for ``tokens`` positions (keeps the ones it has)."""
        table = self.tables.setdefault(rid, [])
        need = -(-tokens // self.page_size) - len(table)
        if need > len(self._free):
            raise KVCacheFull(f"request {rid}: {need} pages wanted, {len(self._free)} free")
        for _ in range(max(0, need)):
            table.append(self._free.pop())
        self.lengths[rid] = max(self.lengths.get(rid, 0), tokens)

    def free(self, rid: int) -> None:
        self._free.extend(reversed(self.tables.pop(rid, [])))
        self.lengths.pop(rid, None)

    def slots(self, rid: int, start: int, stop: int) -> torch.Tensor:
        """Flat slot indices (page * page_size + offset) of positions [start, stop)."""
        table = torch.tensor(self.tables[rid], dtype=torch.long)
        pos = torch.arange(start, stop)
        return table[pos // self.page_size] * self.page_size + pos % self.page_size

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer, ``[pages, page_size, kv_heads, head_dim]`` each."""
        return self.kv[layer, 0], self.kv[layer, 1]

    def pages(self, rid: int, tokens: int) -> torch.Tensor:
        """The page ids holding positions [0, tokens) of one request, on the cache's device."""
        table = self.tables[rid][: -(-tokens // self.page_size)]
        return torch.tensor(table, device=self.kv.device)

    def gather(
        self, layer: int, pages: torch.Tensor, tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions [0, tokens) held in ``pages``, contiguous ``[tokens, kvh, d]``."""
        kv = self.kv[layer][:, pages].reshape(2, -1, self.cfg.kv_heads, self.cfg.head_dim)
        return kv[0, :tokens], kv[1, :tokens]

    def export(self, rid: int, tokens: int) -> torch.Tensor:
        """All layers' K and V of positions [0, tokens): ``[layers, 2, tokens, kvh, d]``."""
        if tokens == 0:
            c = self.cfg
            return self.kv.new_empty(c.layers, 2, 0, c.kv_heads, c.head_dim)
        n = -(-tokens // self.page_size)
        pages = torch.tensor(self.tables[rid][:n], device=self.kv.device)
        block = self.kv[:, :, pages]  # [L, 2, n, page, kvh, d]
        return block.reshape(self.cfg.layers, 2, n * self.page_size, *block.shape[-2:])[
            :, :, :tokens
        ]

    def load(self, rid: int, data: torch.Tensor) -> None:
        """Write an exported ``[layers, 2, tokens, kvh, d]`` block into ``rid``'s pages."""
        tokens = data.shape[2]
        self.ensure(rid, tokens)
        slots = self.slots(rid, 0, tokens).to(self.kv.device)
        flat = self.kv.view(self.cfg.layers, 2, -1, self.cfg.kv_heads, self.cfg.head_dim)
        flat[:, :, slots] = data.to(device=self.kv.device, dtype=self.kv.dtype)
