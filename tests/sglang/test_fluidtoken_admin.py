"""``PUT /admin/fluidtoken`` of the sglang sidecar, in process (no SGLang: the route only moves
the planner's override): the token gate, the bounds, the one-line 4xx, the refusal on an
overlap-scheduled SGLang, its OpenAPI, and that the planner's split follows the new value.
The forced splits on real SGLang servers are in test_sglang_shared_stack.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fluidpd.core.fluidtoken import FluidTokenConfig
from fluidpd.core.types import SLO, Request, Role
from fluidpd.modeldir.embedded import resolve_model_dir
from fluidpd.modeldir.text import TokenText
from fluidpd.profiles import resolve_profile
from fluidpd_sidecar.config import SidecarConfig
from fluidpd_sidecar.sglang.app import create_app
from fluidpd_sidecar.sglang.server import SglangConfig, SglangServer
from fluidpd_sidecar.sglang.service import SglangService

TOKEN = "admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _service(device: str = "cpu", *extra: str) -> SglangService:
    model = resolve_model_dir(None)
    cfg = SidecarConfig(
        worker_id="w0", role=Role.PREFILL, url="http://w0.invalid",
        profile=resolve_profile("llama-3.1-8b", "a100-80gb", None), slo=SLO(2.0, 0.1),
        model=model, admin_token=TOKEN,
        # FluidToken off, as ``--no-fluidtoken`` (the static policy) launches a worker.
        token_cfg=FluidTokenConfig(enabled=False),
    )  # fmt: skip
    # Never started: the TestClient below runs no lifespan, so no SGLang process is launched.
    launch = SglangConfig(python="python3", model_dir=Path("."), port=1, hook_port=2,
                          device=device, extra_args=extra)  # fmt: skip
    server = SglangServer(launch)
    return SglangService(cfg, server, TokenText.from_model_dir(model))


@pytest.fixture
def client() -> tuple[TestClient, SglangService]:
    service = _service()
    return TestClient(create_app(service)), service


def test_force_steal_is_set_and_cleared_at_run_time(
    client: tuple[TestClient, SglangService],
) -> None:
    http, service = client
    assert not service.fluidtoken  # nothing forced: halves go straight to SGLang
    assert http.get("/admin/fluidtoken", headers=AUTH).json() == {"force_steal": None}
    for beta in (0.0, 0.5, 1.0):
        r = http.put("/admin/fluidtoken", json={"force_steal": beta}, headers=AUTH)
        assert r.status_code == 200 and r.json() == {"force_steal": beta}, r.text
        # What the planner's next scheduling iteration reads; halves now go through it.
        assert service.planner.side.forced_steal == beta and service.fluidtoken
    # The next prompt the planner starts takes the setting now in force (beta = 1 here).
    side = service.planner.side
    req = Request(1, 0.0, 40, 4)
    req.decode_worker = "w1"
    side.add(req)
    side.reserved(1, 0.0)
    batch = side.next_batch(0.0, None)
    assert batch is not None and (batch.request.stolen, batch.prefix_tokens) == (40, 0)
    r = http.put("/admin/fluidtoken", json={"force_steal": None}, headers=AUTH)
    assert r.json() == {"force_steal": None} and service.planner.side.forced_steal is None
    assert not service.fluidtoken
    assert http.get("/admin/fluidtoken", headers=AUTH).json() == {"force_steal": None}


@pytest.mark.parametrize(
    ("body", "needle"),
    [({"force_steal": 1.5}, "force_steal"), ({"force_steal": -0.1}, "force_steal"),
     ({"force_steal": "half"}, "force_steal"), ({}, "force_steal"),
     ({"force_steal": 0.5, "beta": 1}, "beta")],
)  # fmt: skip
def test_a_bad_setting_is_one_line_422_and_changes_nothing(
    client: tuple[TestClient, SglangService], body: dict[str, Any], needle: str
) -> None:
    http, service = client
    r = http.put("/admin/fluidtoken", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and needle in detail, detail
    assert service.planner.side.forced_steal is None


def test_the_route_takes_the_admin_token(client: tuple[TestClient, SglangService]) -> None:
    http, service = client
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert http.put("/admin/fluidtoken", json={"force_steal": 1.0},
                        headers=headers).status_code == 401  # fmt: skip
        assert http.get("/admin/fluidtoken", headers=headers).status_code == 401
    assert service.planner.side.forced_steal is None


def test_an_overlap_scheduled_sglang_refuses_a_steal() -> None:
    """On a GPU without FluidToken SGLang runs its overlap scheduler, which has no suffix
    extend: a forced steal would decode from a cache with a hole, so it is refused (409)."""
    service = _service("cuda:0")
    http = TestClient(create_app(service))
    r = http.put("/admin/fluidtoken", json={"force_steal": 0.5}, headers=AUTH)
    assert r.status_code == 409 and "overlap scheduler" in r.json()["detail"], r.text
    assert http.put("/admin/fluidtoken", json={"force_steal": None},
                    headers=AUTH).status_code == 200  # fmt: skip
    started_for_fluidtoken = _service("cuda:0", "--disable-overlap-schedule")
    r = TestClient(create_app(started_for_fluidtoken)).put(
        "/admin/fluidtoken", json={"force_steal": 0.5}, headers=AUTH
    )
    assert r.status_code == 200, r.text


def test_the_route_is_in_the_openapi(client: tuple[TestClient, SglangService]) -> None:
    http, _ = client
    doc = http.get("/openapi.json").json()
    put = doc["paths"]["/admin/fluidtoken"]["put"]
    assert {"200", "401", "409", "422"} <= set(put["responses"])
    schema = put["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    beta = schema["properties"]["force_steal"]["anyOf"][0]
    assert (beta["minimum"], beta["maximum"]) == (0.0, 1.0)
    assert schema["required"] == ["force_steal"]
    assert "401" in doc["paths"]["/admin/fluidtoken"]["get"]["responses"]
