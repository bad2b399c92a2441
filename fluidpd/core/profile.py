"""Model x GPU profiles: the calibrated coefficients every predictor and harness reads.

A profile is data (YAML under ``profiles/``); this module validates it and turns it into
predictor objects. Reading the file is the caller's job (the core does no I/O). Human-facing
units are milliseconds and GB/s; the predictors work in seconds and bytes.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fluidpd.core.predictors import (
    DecodeIterPredictor,
    PrefillPredictor,
    SuffixPredictor,
    TransferModel,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrefillCoefficients(_Strict):
    c1_ms_per_token: float = Field(gt=0)
    c0_ms: float = Field(ge=0)
    c2_ms_per_token2: float = Field(default=0.0, ge=0)


class SuffixCoefficients(_Strict):
    s1_ms_per_token: float = Field(gt=0)
    s0_ms: float = Field(ge=0)
    s2_ms_per_token2: float = Field(default=0.0, ge=0)
    #: Per suffix token per prefix token (``SuffixPredictor.sp``); None: twice the prefill's
    #: c2, the attention a prefill pays per query-key pair (c2 L^2 for L^2 / 2 pairs).
    sp_ms_per_token2: float | None = Field(default=None, ge=0)


class DecodeCoefficients(_Strict):
    a_c_ms_per_token: float = Field(ge=0)
    a_n_ms_per_request: float = Field(ge=0)
    a_0_ms: float = Field(gt=0)


class KVSpec(_Strict):
    capacity_tokens: int = Field(gt=0)
    bytes_per_token: int = Field(gt=0)
    # SGLang clips the output-length estimate it reserves for (SGLANG_CLIP_MAX_NEW_TOKENS).
    reserve_output_clip: int = Field(default=4096, gt=0)


class TransferSpec(_Strict):
    bandwidth_gb_per_s: float = Field(gt=0)
    base_latency_ms: float = Field(ge=0)


class SwitchSpec(_Strict):
    """Engine-side cost of flipping roles once drained (scheduler state, CUDA graphs)."""

    to_decode_ms: float = Field(default=50.0, ge=0)
    to_prefill_ms: float = Field(default=20.0, ge=0)


class Profile(_Strict):
    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    context_limit: int = Field(gt=0)
    max_running_requests: int = Field(gt=0)
    prefill: PrefillCoefficients
    suffix: SuffixCoefficients
    decode: DecodeCoefficients
    kv: KVSpec
    transfer: TransferSpec
    switch: SwitchSpec = SwitchSpec()
    # Context per request assumed for the profile's headline N_TPOT (display only; the decode
    # side uses its live mean context).
    typical_context_tokens: int = Field(default=2048, gt=0)
    sources: list[str] = Field(min_length=1)
    notes: str = ""

    def prefill_predictor(self) -> PrefillPredictor:
        p = self.prefill
        return PrefillPredictor(
            c1=p.c1_ms_per_token * 1e-3, c0=p.c0_ms * 1e-3, c2=p.c2_ms_per_token2 * 1e-3
        )

    def suffix_predictor(self) -> SuffixPredictor:
        s = self.suffix
        sp = (
            2.0 * self.prefill.c2_ms_per_token2
            if s.sp_ms_per_token2 is None
            else s.sp_ms_per_token2
        )
        return SuffixPredictor(
            s1=s.s1_ms_per_token * 1e-3,
            s0=s.s0_ms * 1e-3,
            s2=s.s2_ms_per_token2 * 1e-3,
            sp=sp * 1e-3,
        )

    def decode_predictor(self) -> DecodeIterPredictor:
        d = self.decode
        return DecodeIterPredictor(
            a_c=d.a_c_ms_per_token * 1e-3, a_n=d.a_n_ms_per_request * 1e-3, a_0=d.a_0_ms * 1e-3
        )

    def transfer_model(self) -> TransferModel:
        t = self.transfer
        return TransferModel(
            bandwidth=t.bandwidth_gb_per_s * 1e9, base_latency=t.base_latency_ms * 1e-3
        )

    def n_tpot(self, tpot_slo: float, mean_context: float | None = None) -> int:
        """Derived N_TPOT: the largest decode batch that meets ``tpot_slo`` (eq. 7's bound)."""
        ctx = self.typical_context_tokens if mean_context is None else mean_context
        return min(self.max_running_requests, self.decode_predictor().max_batch(tpot_slo, ctx))
