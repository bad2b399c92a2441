"""The objects a FluidPDDeployment owns, as plain manifests (pure functions, no API calls).

A worker's role lives in the pod's ``fluidpd.io/role`` label, never in its template: the
sidecar reads it at start through the downward API, and a role change later flips the label on
the running pod, so a switch never restarts the container. Per-role Services select on that
label, so they follow a switch with no change of their own.
"""

from __future__ import annotations

from typing import Any

from fluidpd.api.commands import ModelRef, RouterCommand, SidecarCommand
from fluidpd.core.types import Role
from fluidpd_operator.spec import DeploymentSpec

GROUP = "fluidpd.io"
VERSION = "v1alpha1"
PLURAL = "fluidpddeployments"
KIND = "FluidPDDeployment"
RESOURCE = f"{GROUP}/{VERSION}/{PLURAL}"

ROLE_LABEL = f"{GROUP}/role"
DEPLOYMENT_LABEL = f"{GROUP}/deployment"
COMPONENT_LABEL = "app.kubernetes.io/component"
#: The role the operator is moving the pod to (set before the sidecar is asked to switch).
DESIRED_ROLE = f"{GROUP}/desired-role"
SWITCH_STARTED = f"{GROUP}/switch-started"
SWITCH_DRAIN = f"{GROUP}/switch-drain"
#: Scale-in: the pod is draining to be deleted.
RETIRE = f"{GROUP}/retire"
PROFILE_DIR = "/etc/fluidpd/profile"
#: The key of ``model.profileConfigMap`` that holds the profile: the file the workers read,
#: and what the operator forecasts with.
PROFILE_KEY = "profile.yaml"
#: Where every worker and router pod sees ``spec.model.source`` (read-only); ``--model-dir``.
MODEL_DIR = "/mnt/models"
TOKEN_KEY = "token"


def labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "fluidpd",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "fluidpd-operator",
        COMPONENT_LABEL: component,
        DEPLOYMENT_LABEL: name,
    }


def worker_selector(name: str) -> dict[str, str]:
    return {DEPLOYMENT_LABEL: name, COMPONENT_LABEL: "worker"}


def selector_string(match: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match.items()))


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(owner: dict[str, Any], name: str, labels_: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "labels": labels_, "ownerReferences": [owner_reference(owner)]}


def auth_secret_name(name: str, spec: DeploymentSpec) -> str:
    return spec.auth_secret_ref.name if spec.auth_secret_ref else f"{name}-auth"


def auth_secret_key(spec: DeploymentSpec) -> str:
    return spec.auth_secret_ref.key if spec.auth_secret_ref else TOKEN_KEY


def auth_secret(owner: dict[str, Any], token: str) -> dict[str, Any]:
    """The generated bearer token for internal and admin endpoints (when none is referenced)."""
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(owner, f"{name}-auth", labels(name, "auth")),
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def _field_env(var: str, path: str) -> dict[str, Any]:
    return {"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _common_env(name: str, spec: DeploymentSpec) -> list[dict[str, Any]]:
    secret = {"name": auth_secret_name(name, spec), "key": auth_secret_key(spec)}
    return [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("POD_IP", "status.podIP"),
        {"name": "FLUIDPD_ADMIN_TOKEN", "valueFrom": {"secretKeyRef": secret}},
    ]


_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
}


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def _model_volumes(spec: DeploymentSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod volumes and container mounts that carry the profile ConfigMap and the model
    directory (both read-only); the same for workers and routers."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if spec.model.profile_config_map:
        volumes.append({"name": "profile", "configMap": {"name": spec.model.profile_config_map}})
        mounts.append({"name": "profile", "mountPath": PROFILE_DIR, "readOnly": True})
    source = spec.model.source
    if source is not None:
        mount: dict[str, Any] = {"name": "model", "mountPath": MODEL_DIR, "readOnly": True}
        if source.persistent_volume_claim is not None:
            claim = source.persistent_volume_claim
            volumes.append({"name": "model", "persistentVolumeClaim": {
                "claimName": claim.claim_name, "readOnly": claim.read_only}})  # fmt: skip
            if claim.sub_path:
                mount["subPath"] = claim.sub_path
        elif source.host_path is not None:
            host = source.host_path
            volumes.append({"name": "model", "hostPath": {"path": host.path, "type": host.type}})
        mounts.append(mount)
    return volumes, mounts


def _model(spec: DeploymentSpec) -> ModelRef:
    """How workers and routers find the model: the mounted profile or the shipped one, and the
    mounted model directory."""
    m = spec.model
    profile = f"{PROFILE_DIR}/{PROFILE_KEY}" if m.profile_config_map else None
    return ModelRef(m.name, m.gpu, profile, MODEL_DIR if m.source is not None else None)


def sidecar_command(spec: DeploymentSpec) -> SidecarCommand:
    """The worker sidecar's command line; ``$(VAR)`` refers to the container's env."""
    port = spec.engine.port
    return SidecarCommand(
        worker_id="$(POD_NAME)",
        role="$(FLUIDPD_ROLE)",
        host="$(POD_IP)",
        port=port,
        url=f"http://$(POD_IP):{port}",
        model=_model(spec),
        ttft_slo=spec.slo.ttft_seconds,
        tpot_slo=spec.slo.tpot_seconds,
        eta=spec.fluid_token.eta,
        token_dpi_load_high=spec.fluid_token.dpi_load_high,
        token_split_budget=spec.fluid_token.split_budget,
        engine=spec.engine.backend,
        kv_transfer=spec.engine.transfer(),
        fluidtoken=spec.fluid_token.enabled,
        log_level="info",
        extra=tuple(spec.engine.args),
    )


def worker_pod(
    owner: dict[str, Any], spec: DeploymentSpec, pod: str, role: Role, image: str
) -> dict[str, Any]:
    name = owner["metadata"]["name"]
    env = [*_common_env(name, spec), _field_env("FLUIDPD_ROLE", f"metadata.labels['{ROLE_LABEL}']")]
    container: dict[str, Any] = {
        "name": "sidecar",
        "image": spec.engine.image or image,
        "command": ["fluidpd", "sidecar"],
        "args": sidecar_command(spec).argv(),
        "env": env,
        "ports": [{"name": "http", "containerPort": spec.engine.port, "protocol": "TCP"}],
        "readinessProbe": _probe("/readyz", 2, 3),
        "livenessProbe": _probe("/healthz", 10, 6),
        "securityContext": _CONTAINER_SECURITY,
    }
    if spec.engine.resources:
        container["resources"] = spec.engine.resources
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Always",
        # A drain finishes in-flight work; give it the time a long decode needs.
        "terminationGracePeriodSeconds": 120,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001},
    }
    if spec.engine.needs_host_namespaces():
        pod_spec["hostIPC"] = True
        pod_spec["hostPID"] = True
    volumes, mounts = _model_volumes(spec)
    if volumes:
        container["volumeMounts"] = mounts
        pod_spec["volumes"] = volumes
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod,
            "labels": {**labels(name, "worker"), ROLE_LABEL: role.value},
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(spec.engine.port),
                "prometheus.io/path": "/metrics",
            },
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": pod_spec,
    }


def role_service(owner: dict[str, Any], spec: DeploymentSpec, role: Role) -> dict[str, Any]:
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(
            owner, f"{name}-{role.value}", {**labels(name, "worker"), ROLE_LABEL: role.value}
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": {**worker_selector(name), ROLE_LABEL: role.value},
            "ports": [{"name": "http", "port": spec.engine.port, "targetPort": "http"}],
        },
    }


def router_deployment(owner: dict[str, Any], spec: DeploymentSpec, image: str) -> dict[str, Any]:
    name = owner["metadata"]["name"]
    match = {DEPLOYMENT_LABEL: name, COMPONENT_LABEL: "router"}
    port = spec.router.port
    args = RouterCommand(
        "$(POD_IP)", port, _model(spec), pairing=spec.router.pairing, log_level="info"
    ).argv()
    container: dict[str, Any] = {
        "name": "router",
        "image": spec.router.image or image,
        "command": ["fluidpd", "router"],
        "args": args,
        "env": _common_env(name, spec),
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": _probe("/healthz", 2, 3),
        "livenessProbe": _probe("/healthz", 10, 6),
        "securityContext": _CONTAINER_SECURITY,
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
    }
    volumes, mounts = _model_volumes(spec)
    if volumes:
        container["volumeMounts"] = mounts
        pod_spec["volumes"] = volumes
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, f"{name}-router", labels(name, "router")),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {
                    "labels": labels(name, "router"),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def router_service(owner: dict[str, Any], spec: DeploymentSpec) -> dict[str, Any]:
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, f"{name}-router", labels(name, "router")),
        "spec": {
            "type": spec.router.service_type,
            "selector": {DEPLOYMENT_LABEL: name, COMPONENT_LABEL: "router"},
            "ports": [{"name": "http", "port": spec.router.port, "targetPort": "http"}],
        },
    }
