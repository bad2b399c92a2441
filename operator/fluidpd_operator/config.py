"""Operator settings from the environment (the Helm chart sets them on the Deployment)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorConfig:
    #: kopf peering object; the operator runs standalone when it does not exist.
    peering: str = "fluidpd"
    #: Serve the controller's Prometheus metrics on this port (0: off).
    metrics_port: int = 0
    log_level: str = "INFO"
    #: Seconds between full reconciles of every deployment (the safety net behind the events).
    resync_s: float = 30.0
    #: Images for workers and routers whose FluidPDDeployment names none: by default the one
    #: image of the router and the `sim`/`gpu` sidecar (images/fluidpd; the pod's command
    #: picks), and the sglang-worker image (SGLang with FluidPD's sidecar,
    #: images/sglang-worker) for ``backend: sglang``, whose sidecar needs SGLang beside it.
    sidecar_image: str = "ghcr.io/fluidpd/fluidpd:0.1.0"
    sglang_image: str = "ghcr.io/fluidpd/sglang-worker:0.1.0"
    router_image: str = "ghcr.io/fluidpd/fluidpd:0.1.0"

    def worker_image(self, backend: str) -> str:
        """The default worker image of an engine backend."""
        return self.sglang_image if backend == "sglang" else self.sidecar_image

    @classmethod
    def from_env(cls) -> OperatorConfig:
        env = os.environ
        return cls(
            peering=env.get("FLUIDPD_PEERING", cls.peering),
            metrics_port=int(env.get("FLUIDPD_METRICS_PORT", "0") or 0),
            log_level=env.get("FLUIDPD_LOG_LEVEL", cls.log_level).upper(),
            resync_s=float(env.get("FLUIDPD_RESYNC_SECONDS", str(cls.resync_s))),
            sidecar_image=env.get("FLUIDPD_SIDECAR_IMAGE", cls.sidecar_image),
            sglang_image=env.get("FLUIDPD_SGLANG_IMAGE", cls.sglang_image),
            router_image=env.get("FLUIDPD_ROUTER_IMAGE", cls.router_image),
        )
