"""A migrating request's output ids are its engine's: a gpu-engine sidecar adopts outputs past
the served tokenizer's vocabulary (issue #15: the llama-3.1-8b shape, 128,256 ids, served with
the embedded 1,024-id tokenizer, sampled ids >= 1,024, and every adoption of the H200's migrate
drain was refused with HTTP 400, so the drain fell back to waiting)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fastapi.testclient import TestClient

from fluidpd.api.sampling import SamplingParams
from fluidpd.core.types import SLO, Role
from fluidpd.modeldir.embedded import resolve_model_dir
from fluidpd.modeldir.text import TokenText
from fluidpd_sidecar.app import create_app
from fluidpd_sidecar.gpu.config import SHAPES
from fluidpd_sidecar.service import SidecarConfig, SidecarService
from fluidpd_sidecar.transfer_shm import ShmTransfer
from tests.sidecar.helpers import fast_profile

from .pd import engine

VOCAB = 4096  # the engine's; the embedded tokenizer has 1,024


def _adopt(rid: int, output_ids: list[int]) -> dict[str, object]:
    sampling = SamplingParams(max_new_tokens=16, temperature=0.0).model_dump()
    half = {"rid": rid, "prompt_ids": [7] * 32, "arrival": 0.0, "prefill_worker": "p0",
            "prefill_url": "http://p0.invalid", "sampling": sampling}  # fmt: skip
    return {"half": half, "generated": len(output_ids), "output_ids": output_ids,
            "first_token_t": 1.0, "kv_pull": True}  # fmt: skip


def test_adopt_takes_output_ids_of_the_engines_vocabulary(tmp_path: Path) -> None:
    model = resolve_model_dir(None)
    assert model.vocab_size < VOCAB
    staging = ShmTransfer(1 << 22)
    gpu = engine(dataclasses.replace(SHAPES["tiny-llama"], vocab=VOCAB), None, Role.DECODE,
                 staging)  # fmt: skip
    cfg = SidecarConfig(worker_id="d1", role=Role.DECODE, url="http://d1.invalid",
                        profile=fast_profile(tmp_path), slo=SLO(ttft=5.0, tpot=0.5),
                        model=model)  # fmt: skip
    svc = SidecarService(cfg, gpu, staging, TokenText.from_model_dir(model))
    try:
        with TestClient(create_app(svc)) as client:
            ok = client.post("/v1/internal/adopt", json=_adopt(1, [3000, 1024, VOCAB - 1]))
            assert ok.status_code == 200, ok.text
            assert ok.json() == {"ok": True, "kv_pull": True}
            assert 1 in svc.worker.decode.migrating_in
            bad = client.post("/v1/internal/adopt", json=_adopt(2, [5, VOCAB]))
            assert bad.status_code == 400
            assert f"[0, {VOCAB})" in bad.json()["detail"]
            assert 2 not in svc.worker.decode.migrating_in
            doc = client.get("/openapi.json").json()
            body = doc["paths"]["/v1/internal/adopt"]["post"]["requestBody"]
            adopt = body["content"]["application/json"]["schema"]["properties"]
            assert adopt["output_ids"]["items"]["maximum"] == VOCAB - 1
            half = doc["components"]["schemas"]["DecodeHalf"]["properties"]
            assert half["prompt_ids"]["items"]["maximum"] == model.vocab_size - 1
    finally:
        staging.close()
