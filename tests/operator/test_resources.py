"""The operator's pure parts: spec defaults and conversion, manifests, naming and role choice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from fluidpd.core.types import DrainMode, Role
from fluidpd_operator import resources as res
from fluidpd_operator.deployment import next_names, roles_for_new_pods, why_not_ready
from fluidpd_operator.spec import DeploymentSpec

ROOT = Path(__file__).resolve().parents[2]
OWNER: dict[str, Any] = {
    "apiVersion": "fluidpd.io/v1alpha1",
    "kind": "FluidPDDeployment",
    "metadata": {"name": "llm", "namespace": "ns", "uid": "uid-1"},
}


def spec(**overrides: Any) -> DeploymentSpec:
    return DeploymentSpec.model_validate({"model": {"name": "llama-3.1-8b"}, **overrides})


def _example_documents() -> dict[str, list[dict[str, Any]]]:
    """Every example file's documents (FluidPDDeployments and what they need, e.g. a claim)."""
    return {
        path.name: [d for d in yaml.safe_load_all(path.read_text()) if d]
        for path in sorted((ROOT / "examples").glob("*.yaml"))
    }


def test_examples_parse_and_convert() -> None:
    examples = _example_documents()
    assert examples
    for name, docs in examples.items():
        deployments = [d for d in docs if d["kind"] == "FluidPDDeployment"]
        assert len(deployments) == 1, name
        s = DeploymentSpec.model_validate(deployments[0]["spec"])
        cfg = s.fluidrole_config()
        assert cfg.min_prefill == s.min_prefill and cfg.min_decode == s.min_decode
        s.fallback_config()


def test_gpu_example_serves_a_model_directory_from_its_claim() -> None:
    docs = {d["kind"]: d for d in _example_documents()["gpu-h200.yaml"]}
    s = DeploymentSpec.model_validate(docs["FluidPDDeployment"]["spec"])
    assert s.engine.backend == "gpu"
    assert s.model.source is not None and s.model.source.persistent_volume_claim is not None
    claim = docs["PersistentVolumeClaim"]
    assert s.model.source.persistent_volume_claim.claim_name == claim["metadata"]["name"]
    # Statically provisioned: the claim asks for the example's own PV by name.
    assert claim["spec"]["volumeName"] == docs["PersistentVolume"]["metadata"]["name"]
    assert "ReadOnlyMany" in claim["spec"]["accessModes"]
    pod = res.worker_pod(OWNER, s, "llm-worker-0", Role.PREFILL, "img:1")
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--model-dir") + 1] == res.MODEL_DIR
    assert args[args.index("--kv-transfer") + 1] == "mooncake"


def test_spec_defaults_mirror_the_crd() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "fluidpd.io_fluidpddeployments.yaml").read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]
    s = spec()
    assert s.workers == props["workers"]["default"]
    assert s.slo.ttft_seconds == props["slo"]["properties"]["ttftSeconds"]["default"]
    assert s.fluid_token.eta == props["fluidToken"]["properties"]["eta"]["default"]
    split = props["fluidToken"]["properties"]["splitBudget"]["default"]
    assert s.fluid_token.split_budget is split is False
    role_props = props["fluidRole"]["properties"]
    assert s.fluid_role.n_persist == role_props["nPersist"]["default"]
    assert s.fluid_role.drain_mode.value == role_props["drainMode"]["default"]
    scale = props["autoscaling"]["properties"]
    assert s.autoscaling.max_workers == scale["maxWorkers"]["default"]
    source = props["model"]["properties"]["source"]["properties"]
    on_claim = spec(model={"name": "m", "source": {"persistentVolumeClaim": {"claimName": "c"}}})
    on_host = spec(model={"name": "m", "source": {"hostPath": {"path": "/m"}}})
    assert on_claim.model.source and on_claim.model.source.persistent_volume_claim
    assert on_host.model.source and on_host.model.source.host_path
    claim_props = source["persistentVolumeClaim"]["properties"]
    assert (
        on_claim.model.source.persistent_volume_claim.read_only
        is claim_props["readOnly"]["default"]
    )
    host_type = source["hostPath"]["properties"]["type"]
    assert on_host.model.source.host_path.type == host_type["default"]
    assert set(host_type["enum"]) == {"Directory", "DirectoryOrCreate"}


def test_spec_converts_to_core_config() -> None:
    s = spec(fluidRole={"nPersist": 5, "drainMode": "wait", "windowSeconds": 20},
             minPrefill=2, autoscaling={"enabled": True, "maxWorkers": 12})  # fmt: skip
    cfg = s.fluidrole_config()
    assert (cfg.n_persist, cfg.drain_mode, cfg.window_s, cfg.min_prefill) == (
        5, DrainMode.WAIT, 20.0, 2,
    )  # fmt: skip
    fb = s.fallback_config()
    assert fb.enabled and fb.max_workers == 12


def test_bad_spec_is_a_validation_error() -> None:
    with pytest.raises(ValidationError):
        spec(engine={"backend": "vllm"})


@pytest.mark.parametrize(
    ("workers", "prefill", "min_decode", "expected"),
    [(8, None, 1, 4), (8, 6, 1, 6), (4, 4, 1, 3), (4, 3, 2, 2), (3, None, 1, 1)],
)
def test_initial_prefill_is_clamped(
    workers: int, prefill: int | None, min_decode: int, expected: int
) -> None:
    s = spec(workers=workers, prefill=prefill, minDecode=min_decode)
    assert s.initial_prefill() == expected


def test_worker_pod_keeps_the_role_out_of_the_template() -> None:
    s = spec()
    pod = res.worker_pod(OWNER, s, "llm-worker-0", Role.DECODE, "img:1")
    meta, container = pod["metadata"], pod["spec"]["containers"][0]
    assert meta["labels"][res.ROLE_LABEL] == "decode"
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    assert meta["ownerReferences"][0]["controller"] is True
    # The role reaches the sidecar only through the downward API, from the label.
    assert "decode" not in container["args"]
    role_env = next(e for e in container["env"] if e["name"] == "FLUIDPD_ROLE")
    assert role_env["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{res.ROLE_LABEL}']"
    args = container["args"]
    assert args[args.index("--role") + 1] == "$(FLUIDPD_ROLE)"
    assert args[args.index("--model") + 1] == "llama-3.1-8b"
    assert container["image"] == "img:1"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    token = next(e for e in container["env"] if e["name"] == "FLUIDPD_ADMIN_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "llm-auth", "key": "token"}


def test_worker_pod_options() -> None:
    s = spec(fluidToken={"enabled": False, "splitBudget": True},
             engine={"image": "mine:2", "args": ["--seed", "3"]},
             model={"name": "m", "profileConfigMap": "prof"},
             authSecretRef={"name": "tok", "key": "k"})  # fmt: skip
    pod = res.worker_pod(OWNER, s, "llm-worker-1", Role.PREFILL, "img:1")
    c = pod["spec"]["containers"][0]
    assert "--no-fluidtoken" in c["args"] and c["args"][-2:] == ["--seed", "3"]
    assert "--token-split-budget" in c["args"]
    assert (
        "--token-split-budget"
        not in res.worker_pod(OWNER, spec(), "w", Role.PREFILL, "i")["spec"]["containers"][0][
            "args"
        ]
    )
    assert c["args"][c["args"].index("--profile") + 1] == f"{res.PROFILE_DIR}/profile.yaml"
    assert "--model" not in c["args"]
    assert c["image"] == "mine:2"
    assert pod["spec"]["volumes"][0]["configMap"]["name"] == "prof"
    token = next(e for e in c["env"] if e["name"] == "FLUIDPD_ADMIN_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "tok", "key": "k"}


def test_services_select_on_the_role_label() -> None:
    s = spec()
    for role in Role:
        svc = res.role_service(OWNER, s, role)
        assert svc["metadata"]["name"] == f"llm-{role.value}"
        assert svc["spec"]["selector"] == {**res.worker_selector("llm"), res.ROLE_LABEL: role.value}
    router = res.router_deployment(OWNER, spec(router={"replicas": 3}), "r:1")
    assert router["spec"]["replicas"] == 3
    template_labels = router["spec"]["template"]["metadata"]["labels"]
    assert router["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    svc = res.router_service(OWNER, spec(router={"serviceType": "NodePort"}))
    assert svc["spec"]["type"] == "NodePort"


def test_next_names_fill_gaps() -> None:
    assert next_names("w", ["w-0", "w-2"], 3) == ["w-1", "w-3", "w-4"]


def test_roles_for_new_pods() -> None:
    s = spec(workers=8, prefill=3)
    zero = {Role.PREFILL: 0, Role.DECODE: 0}
    assert roles_for_new_pods(8, zero, s, True, None) == [Role.PREFILL] * 3 + [Role.DECODE] * 5
    # Minimums first, then the hint.
    assert roles_for_new_pods(2, {Role.PREFILL: 0, Role.DECODE: 4}, s, False, Role.DECODE) == [
        Role.PREFILL,
        Role.DECODE,
    ]
    # Without a hint, towards the initial split (3/8 prefill).
    assert roles_for_new_pods(1, {Role.PREFILL: 3, Role.DECODE: 3}, s, False, None) == [Role.DECODE]
    assert roles_for_new_pods(1, {Role.PREFILL: 1, Role.DECODE: 6}, s, False, None) == [
        Role.PREFILL
    ]


@pytest.mark.parametrize(
    ("argv", "field"),
    [(["--liveness", "foo"], "--liveness"), (["--metrics-port", "-1"], "--metrics-port")],
)
def test_operator_cli_bad_input_is_one_line(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fluidpd.cli.main import main  # noqa: PLC0415

    assert main(["operator", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def _worker_and_router(s: DeploymentSpec) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, its one container) of a worker pod and of the router's pod template."""
    worker = res.worker_pod(OWNER, s, "llm-worker-0", Role.PREFILL, "img:1")["spec"]
    router = res.router_deployment(OWNER, s, "r:1")["spec"]["template"]["spec"]
    return [(worker, worker["containers"][0]), (router, router["containers"][0])]


def test_model_on_a_claim_is_mounted_read_only_into_workers_and_routers() -> None:
    s = spec(model={"name": "m", "source": {"persistentVolumeClaim": {
        "claimName": "weights", "subPath": "llama/8b"}}})  # fmt: skip
    for pod_spec, container in _worker_and_router(s):
        assert pod_spec["volumes"] == [
            {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}}
        ]
        assert container["volumeMounts"] == [
            {"name": "model", "mountPath": res.MODEL_DIR, "readOnly": True, "subPath": "llama/8b"}
        ]
        args = container["args"]
        assert args[args.index("--model-dir") + 1] == res.MODEL_DIR == "/mnt/models"
        # The served name and the profile still come from spec.model.
        assert args[args.index("--model") + 1] == "m"


def test_model_on_a_host_path_with_a_profile_config_map() -> None:
    s = spec(model={"name": "m", "profileConfigMap": "prof", "source": {"hostPath": {
        "path": "/data/models/tiny"}}})  # fmt: skip
    for pod_spec, container in _worker_and_router(s):
        volumes = _by_name(pod_spec["volumes"])
        assert volumes["model"]["hostPath"] == {"path": "/data/models/tiny", "type": "Directory"}
        assert volumes["profile"]["configMap"] == {"name": "prof"}
        mounts = _by_name(container["volumeMounts"])
        assert mounts["model"] == {"name": "model", "mountPath": res.MODEL_DIR, "readOnly": True}
        assert mounts["profile"]["mountPath"] == res.PROFILE_DIR and mounts["profile"]["readOnly"]
        args = container["args"]
        # The router reads the same profile as the workers (its context limit, its name).
        assert args[args.index("--profile") + 1] == f"{res.PROFILE_DIR}/profile.yaml"
        assert args[args.index("--model-dir") + 1] == res.MODEL_DIR
        assert "--model" not in args


def test_no_model_source_means_no_model_volume_and_no_model_dir() -> None:
    for pod_spec, container in _worker_and_router(spec()):
        assert "volumes" not in pod_spec and "volumeMounts" not in container
        assert "--model-dir" not in container["args"]


def test_claim_read_only_can_be_turned_off_but_the_mount_stays_read_only() -> None:
    s = spec(model={"name": "m", "source": {"persistentVolumeClaim": {
        "claimName": "w", "readOnly": False}}})  # fmt: skip
    for pod_spec, container in _worker_and_router(s):
        assert pod_spec["volumes"][0]["persistentVolumeClaim"]["readOnly"] is False
        assert container["volumeMounts"][0]["readOnly"] is True
        assert "subPath" not in container["volumeMounts"][0]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({}, "exactly one of persistentVolumeClaim or hostPath"),
        ({"hostPath": {"path": "/m"}, "persistentVolumeClaim": {"claimName": "w"}},
         "exactly one of persistentVolumeClaim or hostPath"),
        ({"hostPath": {"path": "models/m"}}, "absolute path"),
        ({"hostPath": {"path": "/models/../etc"}}, "'..'"),
        ({"hostPath": {"path": "/m", "type": "File"}}, "hostPath.type"),
        ({"persistentVolumeClaim": {"claimName": ""}}, "claimName"),
        ({"persistentVolumeClaim": {"claimName": "w", "subPath": "/abs"}}, "relative path"),
        ({"persistentVolumeClaim": {"claimName": "w", "subPath": "a/../../b"}}, "'..'"),
    ],
)  # fmt: skip
def test_bad_model_source_is_a_validation_error(source: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        spec(model={"name": "m", "source": source})
    assert message in str(err.value), err.value


def test_kv_transfer_follows_the_backend_unless_given() -> None:
    def transfer(engine: dict[str, Any]) -> str:
        c = res.worker_pod(OWNER, spec(engine=engine), "w-0", Role.DECODE, "i")["spec"]
        args = c["containers"][0]["args"]
        return str(args[args.index("--kv-transfer") + 1])

    assert transfer({}) == "sim"
    # Real KV between pods that may sit on different nodes: mooncake's TCP transport.
    assert transfer({"backend": "gpu"}) == "mooncake"
    assert transfer({"backend": "gpu", "kvTransfer": "shm"}) == "shm"
    with pytest.raises(ValidationError, match="use shm or mooncake"):
        spec(engine={"backend": "gpu", "kvTransfer": "sim"})


def test_cuda_ipc_worker_pods_share_the_nodes_ipc_and_pid_namespaces() -> None:
    def pod_spec(engine: dict[str, Any]) -> dict[str, Any]:
        got: dict[str, Any] = res.worker_pod(OWNER, spec(engine=engine), "w-0", Role.DECODE,
                                             "i")["spec"]  # fmt: skip
        return got

    ipc = pod_spec({"backend": "gpu", "kvTransfer": "cuda-ipc"})
    args = ipc["containers"][0]["args"]
    assert args[args.index("--kv-transfer") + 1] == "cuda-ipc"
    # Peers open each other's CUDA IPC handles and check each other's pids in /proc.
    assert (ipc["hostIPC"], ipc["hostPID"]) == (True, True)
    for other in ({"backend": "gpu", "kvTransfer": "shm"}, {"backend": "gpu"}, {}):
        assert "hostIPC" not in pod_spec(other) and "hostPID" not in pod_spec(other)
    assert pod_spec({"backend": "gpu", "kvTransfer": "shm", "hostNamespaces": True})["hostIPC"]
    with pytest.raises(ValidationError, match="cuda-ipc needs backend gpu"):
        spec(engine={"backend": "sim", "kvTransfer": "cuda-ipc"})
    with pytest.raises(ValidationError, match="cuda-ipc needs hostNamespaces"):
        spec(engine={"backend": "gpu", "kvTransfer": "cuda-ipc", "hostNamespaces": False})


def test_why_not_ready_names_the_scheduler_or_kubelet_reason() -> None:
    unbound = {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."}
    ]}}  # fmt: skip
    assert why_not_ready(unbound) == (
        "Unschedulable: 0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    )
    creating = {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}],
                           "containerStatuses": [{"state": {"waiting": {
                               "reason": "ContainerCreating"}}}]}}  # fmt: skip
    assert why_not_ready(creating) == "ContainerCreating"
    running = {"status": {"containerStatuses": [{"state": {"running": {}}}]}}
    assert why_not_ready(running) == "" and why_not_ready({}) == ""
