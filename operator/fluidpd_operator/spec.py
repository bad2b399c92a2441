"""The FluidPDDeployment spec as the operator reads it (pydantic, camelCase aliases).

The CRD's OpenAPI schema is what users see and what the API server validates and defaults;
these models mirror its defaults so that an object written before a default existed still
reads the same, and convert the spec into the core's configuration objects.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fluidpd.api import knobs
from fluidpd.api.knobs import FLUIDROLE_KNOBS
from fluidpd.core.fallback import FallbackConfig
from fluidpd.core.fluidrole import FluidRoleConfig, SwitchRule
from fluidpd.core.types import DrainMode


class _Spec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


def _no_backsteps(path: str, field: str) -> str:
    if ".." in PurePosixPath(path).parts:
        raise ValueError(f"{field} must not contain '..'")
    return path


class ClaimSource(_Spec):
    """``model.source.persistentVolumeClaim``: the model directory on a claim, at ``subPath``."""

    claim_name: str = Field(alias="claimName", min_length=1, max_length=253)
    sub_path: str | None = Field(None, alias="subPath", min_length=1)
    read_only: bool = Field(True, alias="readOnly")

    @field_validator("sub_path")
    @classmethod
    def _relative(cls, v: str | None) -> str | None:
        if v is not None and v.startswith("/"):
            raise ValueError("subPath must be a relative path")
        return None if v is None else _no_backsteps(v, "subPath")


class HostPathSource(_Spec):
    """``model.source.hostPath``: the model directory on the node."""

    path: str = Field(min_length=1)
    type: Literal["Directory", "DirectoryOrCreate"] = "Directory"

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("hostPath.path must be an absolute path")
        return _no_backsteps(v, "hostPath.path")


class ModelSource(_Spec):
    """Where the model directory is; exactly one source (the CRD's CEL rule says the same)."""

    persistent_volume_claim: ClaimSource | None = Field(None, alias="persistentVolumeClaim")
    host_path: HostPathSource | None = Field(None, alias="hostPath")

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        if (self.persistent_volume_claim is None) == (self.host_path is None):
            raise ValueError("model.source: set exactly one of persistentVolumeClaim or hostPath")
        return self


class ModelSpec(_Spec):
    name: str
    gpu: str = "a100-80gb"
    profile_config_map: str | None = Field(None, alias="profileConfigMap")
    source: ModelSource | None = None


class EngineSpec(_Spec):
    backend: Literal["sim", "gpu", "sglang"] = "sim"
    #: None: the operator's default (FLUIDPD_SIDECAR_IMAGE, FLUIDPD_SGLANG_IMAGE for sglang).
    image: str | None = None
    args: list[str] = Field(default_factory=list)
    port: int = 8100
    #: None: the backend's default (``transfer()``).
    kv_transfer: Literal["sim", "shm", "mooncake", "cuda-ipc"] | None = Field(
        None, alias="kvTransfer"
    )
    #: The worker pods join the node's IPC and PID namespaces (``hostIPC``, ``hostPID``). None:
    #: only when ``kvTransfer`` is ``cuda-ipc``, which needs both (see ``needs_host_namespaces``).
    host_namespaces: bool | None = Field(None, alias="hostNamespaces")
    resources: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _real_kv_needs_real_transfer(self) -> EngineSpec:
        if self.backend == "gpu" and self.kv_transfer == "sim":
            raise ValueError(
                "engine.kvTransfer: the gpu backend hands off real KV; use shm or mooncake"
            )
        if self.kv_transfer == "cuda-ipc" and self.backend != "gpu":
            raise ValueError("engine.kvTransfer: cuda-ipc needs backend gpu")
        if self.kv_transfer == "cuda-ipc" and self.host_namespaces is False:
            raise ValueError(
                "engine.kvTransfer: cuda-ipc needs hostNamespaces (worker pods must see each "
                "other's CUDA IPC handles and pids)"
            )
        return self

    def needs_host_namespaces(self) -> bool:
        """``cuda-ipc`` opens a peer process's GPU memory by its IPC handle (the container
        runtimes' CUDA IPC needs a shared IPC namespace, as ``docker --ipc=host``) and checks the
        peer is alive by its pid and start time in ``/proc`` (a shared PID namespace): worker
        pods are separate pods, so both are the node's."""
        if self.host_namespaces is not None:
            return self.host_namespaces
        return self.transfer() == "cuda-ipc"

    def transfer(self) -> str:
        """The sidecar's ``--kv-transfer``: as given, else modelled time for the sim backend and
        mooncake (real bytes between pods on any nodes) for the engines that move real KV."""
        if self.kv_transfer is not None:
            return self.kv_transfer
        return "sim" if self.backend == "sim" else "mooncake"


class SLOSpec(_Spec):
    ttft_seconds: float = Field(2.0, alias="ttftSeconds")
    tpot_seconds: float = Field(0.1, alias="tpotSeconds")


class FluidTokenSpec(_Spec):
    enabled: bool = True
    eta: float = 1.25
    dpi_load_high: float = Field(0.6, alias="dpiLoadHigh")
    split_budget: bool = Field(False, alias="splitBudget")


class FluidRoleSpec(_Spec):
    enabled: bool = True
    ppi_low: float = Field(0.6, alias="ppiLow")
    ppi_high: float = Field(1.0, alias="ppiHigh")
    dpi_load_high: float = Field(0.6, alias="dpiLoadHigh")
    dpi_adm_high: float = Field(0.2, alias="dpiAdmHigh")
    window_seconds: float = Field(10.0, alias="windowSeconds")
    interval_seconds: float = Field(1.0, alias="intervalSeconds")
    n_persist: int = Field(3, alias="nPersist")
    cooldown_seconds: float = Field(5.0, alias="cooldownSeconds")
    reversal_cooldown_seconds: float = Field(300.0, alias="reversalCooldownSeconds")
    drain_mode: DrainMode = Field(DrainMode.MIGRATE, alias="drainMode")
    switch_rule: SwitchRule = Field(SwitchRule.PREDICTIVE, alias="switchRule")
    switch_budget: int = Field(2, ge=0, alias="switchBudget")


class AutoscalingSpec(_Spec):
    enabled: bool = False
    max_workers: int = Field(16, alias="maxWorkers")
    scale_out_after_seconds: float = Field(30.0, alias="scaleOutAfterSeconds")
    scale_in_after_seconds: float = Field(300.0, alias="scaleInAfterSeconds")


class RouterSpec(_Spec):
    replicas: int = 1
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        "ClusterIP", alias="serviceType"
    )
    port: int = 8000
    image: str | None = None
    pairing: Literal["round-robin", "least-loaded", "random"] = "round-robin"


class SecretRef(_Spec):
    name: str
    key: str = "token"


class DeploymentSpec(_Spec):
    model: ModelSpec
    engine: EngineSpec = EngineSpec()
    workers: int = 8
    prefill: int | None = None
    min_prefill: int = Field(1, alias="minPrefill")
    min_decode: int = Field(1, alias="minDecode")
    slo: SLOSpec = SLOSpec()
    fluid_token: FluidTokenSpec = Field(FluidTokenSpec(), alias="fluidToken")
    fluid_role: FluidRoleSpec = Field(FluidRoleSpec(), alias="fluidRole")
    autoscaling: AutoscalingSpec = AutoscalingSpec()
    router: RouterSpec = RouterSpec()
    auth_secret_ref: SecretRef | None = Field(None, alias="authSecretRef")

    def initial_prefill(self) -> int:
        """Prefill workers to start with: ``prefill`` (default half), kept inside the minimums
        so that a later ``kubectl scale`` below the initial split is never refused."""
        wanted = self.prefill if self.prefill is not None else self.workers // 2
        return max(self.min_prefill, min(wanted, self.workers - self.min_decode))

    def fluidrole_config(self) -> FluidRoleConfig:
        """The core's config, mapped by the knob table's CRD keys (``fluidpd/api/knobs.py``)."""
        top = self.model_dump(by_alias=True)
        role = top["fluidRole"]
        values = {k.field: (top if k.top_level else role)[k.crd] for k in FLUIDROLE_KNOBS}
        return knobs.fluidrole_config(values, enabled=self.fluid_role.enabled)

    def fallback_config(self) -> FallbackConfig:
        a = self.autoscaling
        return FallbackConfig(
            enabled=a.enabled,
            max_workers=a.max_workers,
            scale_out_after_s=a.scale_out_after_seconds,
            scale_in_after_s=a.scale_in_after_seconds,
        )
