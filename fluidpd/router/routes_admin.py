"""``/admin/*``: the worker set the controller and the operator manage (bearer token)."""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from fluidpd.api.demand import ArrivalsReport
from fluidpd.api.http import bearer_gate
from fluidpd.router.context import RouterContext

log = logging.getLogger("fluidpd.router")

_WORKER_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
#: A sidecar's base URL: http(s), a host name, IPv4 or [IPv6] address, a port, a path. A
#: pattern, not pydantic's URL type, so that the schema says exactly what is taken.
_URL = r"^https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[A-Za-z0-9._~%/-]*)?$"


class WorkerList(BaseModel):
    """The whole worker set (it replaces the current one)."""

    model_config = ConfigDict(extra="forbid")

    workers: dict[
        Annotated[str, StringConstraints(pattern=_WORKER_ID)],
        Annotated[str, StringConstraints(pattern=_URL, max_length=2083)],
    ] = Field(
        min_length=1,
        max_length=4096,
        description="worker id -> sidecar URL (http or https); two workers never share one",
        # patternProperties alone would let any other key through.
        json_schema_extra={"additionalProperties": False},
    )

    @field_validator("workers")
    @classmethod
    def _distinct_urls(cls, v: dict[str, str]) -> dict[str, str]:
        urls = [u.rstrip("/") for u in v.values()]
        if len(set(urls)) != len(urls):
            raise ValueError("two workers share one URL")
        return v

    def urls(self) -> dict[str, str]:
        return {w: u.rstrip("/") for w, u in self.workers.items()}


def routes(ctx: RouterContext) -> APIRouter:
    cfg, workers = ctx.cfg, ctx.workers

    unauthorized: dict[int | str, dict[str, Any]] = {
        401: {"description": "missing or wrong bearer token"}
    }
    router = APIRouter(
        prefix="/admin", dependencies=[bearer_gate(cfg.admin_token)], responses=unauthorized
    )

    @router.get("/stats")
    async def stats() -> dict[str, Any]:
        return workers.stats()

    @router.get(
        "/arrivals",
        responses={400: {"description": "after is not a non-negative integer"}},
    )
    async def arrivals(
        after: Annotated[
            int | None,
            Query(ge=0, description="the next of the previous answer (omitted: all kept)"),
        ] = None,
        epoch: Annotated[
            str | None,
            Query(max_length=64, description="the epoch of the previous answer"),
        ] = None,
    ) -> ArrivalsReport:
        """The client requests that arrived after ``after`` (the controller's demand feed)."""
        # A cursor of another router process (it restarted) means nothing here.
        cursor = None if epoch is not None and epoch != ctx.epoch else after
        return ArrivalsReport.of(ctx.arrivals.since(cursor), ctx.epoch, time.time())

    @router.post("/poll")
    async def poll_now() -> dict[str, Any]:
        """Re-read every worker now (the controller calls this when it starts or ends a switch)."""
        await workers.poll_once()
        return workers.stats()

    @router.put(
        "/workers",
        responses={
            400: {"description": "invalid worker list"},
            409: {"description": "the new set has no usable prefill/decode pair, the current does"},
        },
    )
    async def put_workers(body: WorkerList) -> dict[str, Any]:
        new = body.urls()
        # A set the router cannot serve with must not replace one it can (a bad call would
        # otherwise stop all serving until someone puts the list back).
        if workers.usable() and not await workers.usable_with(new):
            raise HTTPException(
                409,
                "workers: no reachable Active prefill and decode worker in the new set; "
                "the current set is kept",
            )
        workers.set(new)
        await workers.poll_once()
        log.info("worker set replaced: %s", ", ".join(sorted(new)))
        return workers.stats()

    return router
