"""One typed source for the FluidRole knobs and the sidecar and router command lines, checked
against the three places that must agree with it: the CRD's schema, the CLI parsers and the
core."""

from __future__ import annotations

import argparse
import dataclasses
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluidpd.api.commands import (
    GpuEngineArgs,
    ModelRef,
    RouterCommand,
    SidecarCommand,
    SimEngineArgs,
)
from fluidpd.api.knobs import FLUIDROLE_KNOBS
from fluidpd.cli import controller_cmd, router_cmd, sidecar_cmd
from fluidpd.cli.policy_options import fluidrole_argv, fluidrole_config
from fluidpd.core.fluidrole import FluidRoleConfig
from fluidpd.core.pairing import PAIRINGS
from fluidpd.core.types import Role
from fluidpd_operator import resources as res
from fluidpd_operator.spec import DeploymentSpec, FluidRoleSpec

ROOT = Path(__file__).resolve().parents[2]


def _crd_spec_properties() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "fluidpd.io_fluidpddeployments.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props: dict[str, Any] = schema["properties"]["spec"]["properties"]
    return props


def _parser(add: Any) -> argparse.ArgumentParser:
    root = argparse.ArgumentParser()
    add(root.add_subparsers())
    return root


def test_every_knob_is_in_the_crd_with_the_cores_default() -> None:
    props = _crd_spec_properties()
    role = props["fluidRole"]["properties"]
    for k in FLUIDROLE_KNOBS:
        where = props if k.top_level else role
        assert k.crd in where, k.crd
        default = where[k.crd]["default"]
        assert k.kind(default) == k.default, k.field
    # Nothing in spec.fluidRole escapes the table (besides the on/off switch).
    assert set(role) == {"enabled"} | {k.crd for k in FLUIDROLE_KNOBS if not k.top_level}
    aliases = {f.alias or name for name, f in FluidRoleSpec.model_fields.items()}
    assert aliases == set(role)


def test_every_config_field_a_user_sets_is_a_knob() -> None:
    # The predictive rule's forecast horizon, margin, settle/freeze times and budget window are
    # the rule's own constants (issue #14), not settings a deployment tunes.
    internal = {"enabled", "percentile", "dpi_adm_saturated", "ppi_saturated", "busy_saturated",
                "horizon_s", "gain_margin", "settle_s", "freeze_s", "budget_window_s"}  # fmt: skip
    fields = {f.name for f in dataclasses.fields(FluidRoleConfig)} - internal
    assert fields == {k.field for k in FLUIDROLE_KNOBS}


def test_cli_and_crd_defaults_give_the_cores_default_config() -> None:
    args = _parser(controller_cmd.add_parser).parse_args(["controller", "--router", "http://r"])
    assert fluidrole_config(args) == FluidRoleConfig()
    assert DeploymentSpec.model_validate({"model": {"name": "m"}}).fluidrole_config() == (
        FluidRoleConfig()
    )


def test_cli_and_crd_map_each_knob_to_the_same_field() -> None:
    """A distinct value per knob: a swapped or dropped mapping shows as a wrong field."""
    values: dict[str, Any] = {}
    for i, k in enumerate(FLUIDROLE_KNOBS):
        if issubclass(k.kind, Enum):  # a member other than the default
            values[k.field] = next(m for m in k.kind if m != k.default)
        elif k.kind is int:
            values[k.field] = 2 + i
        else:
            values[k.field] = 0.5 + i  # increasing: ppi_low < ppi_high, interval < window
    want = FluidRoleConfig(**values)
    argv = ["controller", "--router", "http://r"]
    for k in FLUIDROLE_KNOBS:
        v = values[k.field]
        argv += [k.flag, v.value if isinstance(v, Enum) else str(v)]
    args = _parser(controller_cmd.add_parser).parse_args(argv)
    assert fluidrole_config(args) == want
    # What `up` hands the controller parses back to the same config.
    again = _parser(controller_cmd.add_parser).parse_args(
        ["controller", "--router", "http://r", *fluidrole_argv(args)]
    )
    assert fluidrole_config(again) == want
    role = {k.crd: values[k.field] for k in FLUIDROLE_KNOBS if not k.top_level}
    top = {k.crd: values[k.field] for k in FLUIDROLE_KNOBS if k.top_level}
    role = {key: v.value if isinstance(v, Enum) else v for key, v in role.items()}
    spec = DeploymentSpec.model_validate({"model": {"name": "m"}, "fluidRole": role, **top})
    assert spec.fluidrole_config() == want


def _sidecar_args(cmd: SidecarCommand) -> argparse.Namespace:
    return _parser(sidecar_cmd.add_parser).parse_args(["sidecar", *cmd.argv()])


def test_sidecar_command_parses_back_to_its_fields() -> None:
    cmd = SidecarCommand(
        worker_id="w3",
        role="decode",
        host="10.0.0.3",
        port=8123,
        url="http://w3:8123",
        model=ModelRef(profile="/etc/p.yaml", model_dir="/mnt/models"),
        ttft_slo=1.5,
        tpot_slo=0.05,
        eta=1.1,
        token_dpi_load_high=0.7,
        token_split_budget=True,
        engine="gpu",
        kv_transfer="shm",
        kv_arena_mib=512,
        fluidtoken=False,
        adaptive=True,
        force_steal=0.25,
        sim=SimEngineArgs(noise=0.1, drift=1.2, seed=7),
        gpu=GpuEngineArgs("llama-3.2-1b", "cuda:1", "float16", 5),
        log_level="info",
    )
    a = _sidecar_args(cmd)
    assert (a.id, a.role, a.host, a.port, a.url) == ("w3", "decode", "10.0.0.3", 8123, cmd.url)
    assert (a.profile, a.model_dir) == ("/etc/p.yaml", "/mnt/models")
    assert (a.ttft_slo, a.tpot_slo, a.eta, a.token_dpi_load_high) == (1.5, 0.05, 1.1, 0.7)
    assert a.token_split_budget is True
    assert (a.engine, a.kv_transfer, a.kv_arena_mib) == ("gpu", "shm", 512)
    assert (a.no_fluidtoken, a.adaptive, a.force_steal) == (True, True, 0.25)
    assert (a.noise, a.drift, a.seed) == (0.1, 1.2, 7)
    assert (a.gpu_model, a.device, a.dtype, a.weight_seed) == (
        "llama-3.2-1b",
        "cuda:1",
        "float16",
        5,
    )
    assert a.log_level == "info"


def test_sidecar_command_leaves_unset_options_to_the_sidecar() -> None:
    cmd = SidecarCommand("w0", "prefill", "127.0.0.1", 8101, ModelRef("m1", "h200"), 2.0, 0.1,
                         1.25, 0.6, extra=("--seed", "9"))  # fmt: skip
    a = _sidecar_args(cmd)
    assert (a.model, a.gpu, a.profile, a.model_dir) == ("m1", "h200", None, None)
    assert a.url is None and a.engine == "sim" and a.noise == 0.0 and a.seed == 9
    assert not a.no_fluidtoken and a.force_steal is None
    assert cmd.argv()[-2:] == ["--seed", "9"]  # passed through last: it overrides


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"engine": "vllm"}, "engine"),
        ({"kv_transfer": "rdma"}, "kv_transfer"),
        ({"gpu": GpuEngineArgs("llama-3.2-1b", "cuda:0", "bfloat16", 0)}, "gpu engine"),
    ],
)
def test_sidecar_command_refuses_what_the_sidecar_would(change: dict[str, Any], field: str) -> None:
    base = SidecarCommand("w0", "prefill", "h", 1, ModelRef(), 2.0, 0.1, 1.25, 0.6)
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(base, **change)


def test_operator_worker_command_parses_with_the_sidecar_parser() -> None:
    spec = DeploymentSpec.model_validate(
        {
            "model": {"name": "llama-3.1-8b", "gpu": "h200"},
            "slo": {"ttftSeconds": 3},
            "fluidToken": {"eta": 1.5},
            "engine": {"port": 8200},
        }
    )
    pod = res.worker_pod({"metadata": {"name": "x", "uid": "u"}}, spec, "x-0", Role.PREFILL, "i")
    env = {"POD_NAME": "x-0", "FLUIDPD_ROLE": "prefill", "POD_IP": "10.1.2.3"}
    args = pod["spec"]["containers"][0]["args"]
    for var, value in env.items():  # what the kubelet expands
        args = [arg.replace(f"$({var})", value) for arg in args]
    a = _parser(sidecar_cmd.add_parser).parse_args(["sidecar", *args])
    assert (a.id, a.role, a.port, a.url) == ("x-0", "prefill", 8200, "http://10.1.2.3:8200")
    assert (a.model, a.gpu, a.ttft_slo, a.eta) == ("llama-3.1-8b", "h200", 3.0, 1.5)
    assert (a.kv_transfer, a.log_level) == ("sim", "info")


def test_router_command_parses_back_to_its_fields() -> None:
    cmd = RouterCommand("0.0.0.0", 8100, ModelRef("m1", "h200", model_dir="/models/m1"),
                        pairing="least-loaded", first_token_timeout=30.0, log_level="debug",
                        workers=("p0=http://h:1", "d0=http://h:2"))  # fmt: skip
    a = _parser(router_cmd.add_parser).parse_args(["router", *cmd.argv()])
    assert (a.host, a.port, a.model, a.gpu, a.model_dir) == ("0.0.0.0", 8100, "m1", "h200",
                                                             "/models/m1")  # fmt: skip
    assert (a.pairing, a.first_token_timeout, a.log_level) == ("least-loaded", 30.0, "debug")
    assert a.worker == ["p0=http://h:1", "d0=http://h:2"]
    bare = RouterCommand("h", 1, ModelRef(profile="/p.yaml")).argv()
    assert bare == ["--host", "h", "--port", "1", "--profile", "/p.yaml"]


def test_operator_router_command_parses_with_the_router_parser() -> None:
    spec = DeploymentSpec.model_validate({"model": {"name": "llama-3.1-8b", "gpu": "h200"}})
    dep = res.router_deployment({"metadata": {"name": "x", "uid": "u"}}, spec, "i")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    args = [arg.replace("$(POD_IP)", "10.1.2.3") for arg in args]
    a = _parser(router_cmd.add_parser).parse_args(["router", *args])
    assert (a.host, a.port, a.model, a.gpu, a.log_level) == (
        "10.1.2.3", spec.router.port, "llama-3.1-8b", "h200", "info"
    )  # fmt: skip


def test_router_pairing_from_the_crd_reaches_the_router_and_offers_every_pairing() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "fluidpd.io_fluidpddeployments.yaml").read_text())
    spec_props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pairing = spec_props["properties"]["router"]["properties"]["pairing"]
    assert tuple(pairing["enum"]) == PAIRINGS
    for value in PAIRINGS:
        spec = DeploymentSpec.model_validate(
            {"model": {"name": "llama-3.1-8b", "gpu": "h200"}, "router": {"pairing": value}}
        )
        dep = res.router_deployment({"metadata": {"name": "x", "uid": "u"}}, spec, "i")
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert _parser(router_cmd.add_parser).parse_args(["router", *args]).pairing == value
    default = DeploymentSpec.model_validate({"model": {"name": "m"}}).router.pairing
    assert default == pairing["default"] == "round-robin"
    with pytest.raises(ValueError, match="pairing"):
        DeploymentSpec.model_validate({"model": {"name": "m"}, "router": {"pairing": "fastest"}})
