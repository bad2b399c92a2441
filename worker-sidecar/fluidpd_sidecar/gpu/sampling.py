"""Batched token sampling on the device: penalties, temperature, top-k / top-p / min-p, seeds,
logprobs.

One ``Sampler.sample`` call picks the next token of every row of a step's logits (the decode
batch plus any suffix extends, or one prefill) with one host sync. The stages, in order:

1. **Penalties** (rows that ask for them). ``repetition_penalty`` r with Hugging Face / vLLM
   semantics over the prompt *and* the generated tokens: a seen token's logit l becomes l / r
   if l > 0, else l * r. Then ``frequency_penalty`` f and ``presence_penalty`` q with OpenAI
   semantics over the *generated* tokens only: l - f * count - q * (count > 0).
2. **Greedy** rows (temperature below ``GREEDY_EPS``, vLLM's 1e-5) take the argmax of the
   penalised logits: what ``transformers``' ``generate(do_sample=False)`` computes.
3. **Temperature** T, then **top-k** (ties at the k-th value kept), **top-p** (the tokens whose
   cumulative probability from the least likely up is <= 1 - p are dropped, the most likely
   always kept) and **min-p** (tokens under min_p x the top probability dropped), in
   ``transformers``' warper order (its ``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
   ``TopPLogitsWarper``, ``MinPLogitsWarper``), computed the same way so that the tests can
   compare them one for one.
4. **The draw**: the exponential race (Gumbel-max) ``argmax(s_i - log(-log u_i))`` over the
   filtered scores s, which samples from ``softmax(s)`` exactly. For a request with a
   ``seed`` the uniforms u are a counter-based hash of (seed, output position k, token id), so
   output token k depends only on the seed, k and the logits: the same seed and prompt give
   the same output on any worker, in any batch, and across a prefill/decode split or a
   migration (the prefill side draws position 0 with the same hash). Requests without a seed
   draw u from the engine's own ``torch.Generator``.

**Logprobs** (when a row asks: ``logprobs`` or ``top_logprobs`` > 0) are those of the model's
own distribution, ``log_softmax`` of the raw logits before penalties, temperature and
truncation (vLLM's default ``raw_logprobs``; ``fluidpd.api.sampling`` states the same for
every engine): the chosen token's and the ``top_logprobs`` most likely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fluidpd.api.sampling import MAX_TOP_LOGPROBS, SampledToken, SamplingParams

#: Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``): the draw would be the argmax
#: anyway, and dividing by them overflows.
GREEDY_EPS = 1e-5

_MASK32 = 0xFFFFFFFF


def is_greedy(p: SamplingParams) -> bool:
    return p.temperature < GREEDY_EPS


def has_penalties(p: SamplingParams) -> bool:
    return p.frequency_penalty != 0 or p.presence_penalty != 0 or p.repetition_penalty != 1


def is_plain_greedy(p: SamplingParams) -> bool:
    """Argmax of the raw logits is the whole answer (the CUDA graph computes it already)."""
    return is_greedy(p) and not has_penalties(p) and not p.wants_logprobs


# -- the stages, as pure functions over [B, V] float32 scores ------------------------------------
def apply_penalties(
    logits: torch.Tensor,
    counts: torch.Tensor,
    seen: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """``counts`` [B, V]: generated-token counts; ``seen`` [B, V]: in the prompt or generated;
    the three penalties [B]. Returns new scores (repetition first, then frequency/presence)."""
    r = repetition[:, None]
    penalised = torch.where(logits > 0, logits / r, logits * r)
    out = torch.where(seen, penalised, logits)
    c = counts.to(out.dtype)
    return out - frequency[:, None] * c - presence[:, None] * (c > 0).to(out.dtype)


def apply_top_k(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Keep each row's k highest scores and ties with the k-th (k <= 0: keep all)."""
    vocab = scores.shape[-1]
    k = k.clamp(max=vocab)
    kmax = int(k.max())
    if kmax <= 0:
        return scores
    top = scores.topk(kmax, dim=-1).values
    kth = top.gather(1, (k.clamp(min=1) - 1)[:, None])
    kth = torch.where(k[:, None] > 0, kth, torch.full_like(kth, float("-inf")))
    return scores.masked_fill(scores < kth, float("-inf"))


def apply_top_p(scores: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Drop the tokens whose cumulative probability, least likely first, is <= 1 - p (the most
    likely token always stays; p >= 1 keeps every token)."""
    ascending, order = scores.sort(dim=-1)
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    threshold = torch.where(p < 1, 1 - p, torch.full_like(p, -1.0))
    drop = cumulative <= threshold[:, None]
    drop[:, -1] = False
    return scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))


def apply_min_p(scores: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p x the row's top probability."""
    probs = scores.softmax(dim=-1)
    floor = min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return scores.masked_fill(probs < floor, float("-inf"))


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2**32 for x in [0, 2**32), without int64 overflow (split c in 16-bit halves)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (Wellons' ``lowbias32``), a bijection on [0, 2**32), on
    int64 tensors; identical on every device."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A 32-bit key per (seed, output position); ``seeds`` int64 (any value, taken mod 2**64)."""
    lo = seeds & _MASK32
    hi = (seeds >> 32) & _MASK32
    key = mix32(mix32(lo ^ 0x9E3779B9) ^ hi)
    return mix32(key ^ (positions & _MASK32))


def seeded_uniforms(keys: torch.Tensor, token_hash: torch.Tensor) -> torch.Tensor:
    """Uniforms in (0, 1), [B, V]: two hash rounds of (row key, token), 24 bits each."""
    h = mix32(keys[:, None] ^ token_hash[None, :])
    h = mix32(h ^ mix32(keys ^ 0x85EBCA6B)[:, None])
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def race(scores: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The exponential race: argmax(s - log E) with E = -log u ~ Exp(1) samples softmax(s)."""
    return (scores - (-uniforms.log()).log()).argmax(dim=-1)


# -- per-request state -------------------------------------------------------------------------
class PenaltyState:
    """Dense per-request token statistics on the device, for rows with penalties: generated
    counts (frequency/presence) and a seen mask over prompt + generated (repetition). One row
    of a pool per request, so a step gathers and updates them with a few kernels."""

    def __init__(self, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.device = device
        self.counts = torch.zeros(0, vocab, dtype=torch.int32, device=device)
        self.seen = torch.zeros(0, vocab, dtype=torch.bool, device=device)
        self.slots: dict[int, int] = {}
        self._free: list[int] = []

    def __contains__(self, rid: int) -> bool:
        return rid in self.slots

    def add(self, rid: int, prompt_ids: Sequence[int], generated: Sequence[int] = ()) -> None:
        if not self._free:
            n = max(8, 2 * self.counts.shape[0])
            grow = n - self.counts.shape[0]
            self._free = list(range(n - 1, self.counts.shape[0] - 1, -1))
            self.counts = torch.cat([self.counts, self.counts.new_zeros(grow, self.vocab)])
            self.seen = torch.cat([self.seen, self.seen.new_zeros(grow, self.vocab)])
        slot = self._free.pop()
        self.slots[rid] = slot
        self.counts[slot].zero_()
        self.seen[slot].zero_()
        if prompt_ids:
            self.seen[slot, torch.tensor(list(prompt_ids), device=self.device)] = True
        if generated:
            out = torch.tensor(list(generated), device=self.device)
            self.counts[slot] += torch.bincount(out, minlength=self.vocab).to(torch.int32)
            self.seen[slot, out] = True

    def drop(self, rid: int) -> None:
        slot = self.slots.pop(rid, None)
        if slot is not None:
            self._free.append(slot)

    def record(self, rids: Sequence[int], tokens: torch.Tensor) -> None:
        """Tokens [len(rids)] were generated for these requests."""
        slots = torch.tensor([self.slots[r] for r in rids], device=self.device)
        ones = torch.ones(len(rids), dtype=torch.int32, device=self.device)
        self.counts.index_put_((slots, tokens), ones, accumulate=True)
        self.seen[slots, tokens] = True


@dataclass(frozen=True, slots=True)
class Row:
    """One row of a step's logits: whose, with what parameters, which output position."""

    rid: int
    params: SamplingParams
    position: int


class Sampler:
    """The engine's sampler: its RNG for unseeded requests and its penalty state."""

    def __init__(self, vocab: int, device: torch.device, seed: int | None = None) -> None:
        self.vocab = vocab
        self.device = device
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self.penalties = PenaltyState(vocab, device)
        self._token_hash = mix32(torch.arange(vocab, dtype=torch.int64, device=device))

    def add(
        self,
        rid: int,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        generated: Sequence[int] = (),
    ) -> None:
        """A request starts here, with ``generated`` tokens already out (penalised requests get
        their state; the others need none)."""
        if has_penalties(params) and rid not in self.penalties:
            self.penalties.add(rid, prompt_ids, generated)

    def drop(self, rid: int) -> None:
        self.penalties.drop(rid)

    def _floats(self, values: Sequence[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=self.device)

    def _penalise(self, logits: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
        idx = [i for i, r in enumerate(rows) if r.rid in self.penalties]
        if not idx:
            return logits
        pen = [rows[i] for i in idx]
        slots = torch.tensor([self.penalties.slots[r.rid] for r in pen], device=self.device)
        at = torch.tensor(idx, device=self.device)
        sub = apply_penalties(
            logits[at],
            self.penalties.counts[slots],
            self.penalties.seen[slots],
            self._floats([r.params.frequency_penalty for r in pen]),
            self._floats([r.params.presence_penalty for r in pen]),
            self._floats([r.params.repetition_penalty for r in pen]),
        )
        return logits.index_copy(0, at, sub)

    def _uniforms(self, rows: Sequence[Row]) -> torch.Tensor:
        n = len(rows)
        u = torch.empty(n, self.vocab, dtype=torch.float32, device=self.device)
        seeded = [i for i, r in enumerate(rows) if r.params.seed is not None]
        free = [i for i, r in enumerate(rows) if r.params.seed is None]
        if free:
            draw = torch.rand(len(free), self.vocab, generator=self.generator, device=self.device)
            u[torch.tensor(free, device=self.device)] = draw
        if seeded:
            seeds = torch.tensor(
                [_as_int64(rows[i].params.seed) for i in seeded], device=self.device
            )
            pos = torch.tensor([rows[i].position for i in seeded], device=self.device)
            keys = row_keys(seeds, pos)
            u[torch.tensor(seeded, device=self.device)] = seeded_uniforms(keys, self._token_hash)
        return u

    def _draw(self, logits: torch.Tensor, rows: Sequence[Row]) -> torch.Tensor:
        """The token of each row [B] from its penalised logits."""
        greedy = [is_greedy(r.params) for r in rows]
        if all(greedy):
            return logits.argmax(dim=-1)
        temps = self._floats(
            [1.0 if g else r.params.temperature for g, r in zip(greedy, rows, strict=True)]
        )
        scores = logits / temps[:, None]
        filtered = scores
        top_k = [r.params.top_k for r in rows]
        if any(k > 0 for k in top_k):
            k = torch.tensor(top_k, device=self.device)
            filtered = apply_top_k(filtered, k)
        top_p = [r.params.top_p for r in rows]
        if any(p < 1 for p in top_p):
            filtered = apply_top_p(filtered, self._floats(top_p))
        min_p = [r.params.min_p for r in rows]
        if any(m > 0 for m in min_p):
            filtered = apply_min_p(filtered, self._floats(min_p))
        drawn = race(filtered, self._uniforms(rows))
        if any(greedy):
            mask = torch.tensor(greedy, device=self.device)
            drawn = torch.where(mask, logits.argmax(dim=-1), drawn)
        return drawn

    def sample(self, logits: torch.Tensor, rows: Sequence[Row]) -> list[SampledToken]:
        """The next token of each row of ``logits`` [len(rows), V] (not modified)."""
        if not rows:
            return []
        raw = logits.float()
        tokens = self._draw(self._penalise(raw, rows), rows)
        pen = [i for i, r in enumerate(rows) if r.rid in self.penalties]
        if pen:
            self.penalties.record(
                [rows[i].rid for i in pen], tokens[torch.tensor(pen, device=self.device)]
            )
        want = [i for i, r in enumerate(rows) if r.params.wants_logprobs]
        if not want:
            return [SampledToken(int(t)) for t in tokens.tolist()]
        at = torch.tensor(want, device=self.device)
        lp = raw[at].log_softmax(dim=-1)
        chosen = lp.gather(1, tokens[at][:, None])[:, 0]
        n = min(MAX_TOP_LOGPROBS, max(rows[i].params.top_logprobs for i in want), self.vocab)
        top_v, top_i = lp.topk(n, dim=-1) if n > 0 else (lp[:, :0], lp[:, :0].long())
        host_tokens = tokens.tolist()
        host_chosen, host_v, host_i = chosen.tolist(), top_v.tolist(), top_i.tolist()
        out = [SampledToken(int(t)) for t in host_tokens]
        for j, i in enumerate(want):
            k = min(rows[i].params.top_logprobs, n)
            top = tuple(zip(host_i[j][:k], host_v[j][:k], strict=True))
            out[i] = SampledToken(int(host_tokens[i]), float(host_chosen[j]), top)
        return out


def _as_int64(seed: int | None) -> int:
    """A seed of any size as a signed 64-bit value (its low 64 bits)."""
    s = int(seed or 0) & 0xFFFFFFFFFFFFFFFF
    return s - (1 << 64) if s >= 1 << 63 else s
