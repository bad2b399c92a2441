"""The router exports every client request's arrival (``GET /admin/arrivals``): prompt length
and ``max_tokens`` as admitted, each once, after the reader's cursor, behind the admin token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from fluidpd.api.demand import ArrivalsReport
from fluidpd.modeldir.embedded import resolve_model_dir
from fluidpd.router.app import RouterConfig, create_app
from fluidpd.router.prompts import Prompter

TOKEN = {"Authorization": "Bearer secret"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    # No workers: a request is admitted (and counted), then answered 503 at once.
    cfg = RouterConfig(
        model="served", context_limit=256, workers={}, admin_token="secret",
        first_token_timeout_s=0.0,
    )  # fmt: skip
    with TestClient(create_app(cfg, Prompter(resolve_model_dir(None)))) as c:
        yield c


def _arrivals(client: TestClient, **params: str | int) -> ArrivalsReport:
    resp = client.get("/admin/arrivals", params=params, headers=TOKEN)
    assert resp.status_code == 200, resp.text
    return ArrivalsReport.model_validate_json(resp.content)


def _complete(client: TestClient, prompt: list[int], max_tokens: int) -> None:
    body = {"model": "served", "prompt": prompt, "max_tokens": max_tokens}
    assert client.post("/v1/completions", json=body).status_code == 503


def test_each_request_arrives_once_with_its_lengths_after_the_cursor(client: TestClient) -> None:
    start = _arrivals(client)
    _complete(client, [1, 2, 3, 4, 5], 7)
    _complete(client, [9] * 20, 3)
    report = _arrivals(client, after=start.next, epoch=start.epoch)
    assert [(a.prompt, a.output) for a in report.arrivals] == [(5, 7), (20, 3)]
    assert report.next == start.next + 2 and report.dropped == 0
    assert report.epoch == start.epoch
    assert all(start.t <= a.t <= report.t for a in report.arrivals)
    assert _arrivals(client, after=report.next, epoch=report.epoch).arrivals == []


def test_a_refused_request_is_no_arrival(client: TestClient) -> None:
    start = _arrivals(client)
    resp = client.post(
        "/v1/completions", json={"model": "served", "prompt": [1], "max_tokens": 999}
    )
    assert resp.status_code == 400
    assert _arrivals(client, after=start.next, epoch=start.epoch).arrivals == []


def test_a_cursor_of_another_router_process_reads_the_whole_log(client: TestClient) -> None:
    whole = _arrivals(client)
    other = _arrivals(client, after=whole.next, epoch="another-process")
    assert len(other.arrivals) == len(whole.arrivals) > 0


def test_arrivals_need_the_admin_token_and_a_valid_cursor(client: TestClient) -> None:
    assert client.get("/admin/arrivals").status_code == 401
    assert client.get("/admin/arrivals", params={"after": -1}, headers=TOKEN).status_code == 400
