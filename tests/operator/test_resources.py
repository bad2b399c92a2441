"""The operator's pure parts: spec defaults and conversion, manifests, naming and role choice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from fluidpd.core.types import DrainMode, Role
from fluidpd_operator import resources as res
from fluidpd_operator.deployment import next_names, roles_for_new_pods
from fluidpd_operator.spec import DeploymentSpec

ROOT = Path(__file__).resolve().parents[2]
OWNER: dict[str, Any] = {
    "apiVersion": "fluidpd.io/v1alpha1",
    "kind": "FluidPDDeployment",
    "metadata": {"name": "llm", "namespace": "ns", "uid": "uid-1"},
}


def spec(**overrides: Any) -> DeploymentSpec:
    return DeploymentSpec.model_validate({"model": {"name": "llama-3.1-8b"}, **overrides})


def test_examples_parse_and_convert() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        s = DeploymentSpec.model_validate(doc["spec"])
        cfg = s.fluidrole_config()
        assert cfg.min_prefill == s.min_prefill and cfg.min_decode == s.min_decode
        s.fallback_config()


def test_spec_defaults_mirror_the_crd() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "fluidpd.io_fluidpddeployments.yaml").read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]
    s = spec()
    assert s.workers == props["workers"]["default"]
    assert s.slo.ttft_seconds == props["slo"]["properties"]["ttftSeconds"]["default"]
    assert s.fluid_token.eta == props["fluidToken"]["properties"]["eta"]["default"]
    role_props = props["fluidRole"]["properties"]
    assert s.fluid_role.n_persist == role_props["nPersist"]["default"]
    assert s.fluid_role.drain_mode.value == role_props["drainMode"]["default"]
    scale = props["autoscaling"]["properties"]
    assert s.autoscaling.max_workers == scale["maxWorkers"]["default"]


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
    s = spec(fluidToken={"enabled": False}, engine={"image": "mine:2", "args": ["--seed", "3"]},
             model={"name": "m", "profileConfigMap": "prof"},
             authSecretRef={"name": "tok", "key": "k"})  # fmt: skip
    pod = res.worker_pod(OWNER, s, "llm-worker-1", Role.PREFILL, "img:1")
    c = pod["spec"]["containers"][0]
    assert "--no-fluidtoken" in c["args"] and c["args"][-2:] == ["--seed", "3"]
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
