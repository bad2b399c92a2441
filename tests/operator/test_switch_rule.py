"""The operator's controller decides with the predictive switch rule (issue #14), as
``fluidpd up``'s does: it is given the workers' profile (the mounted ConfigMap's, else the
shipped one), the deployment's SLO and every router's arrivals. A profile it cannot read
leaves it on the paper's rule, and an API error is retried."""

from __future__ import annotations

from typing import Any

from fluidpd.core.types import Role
from fluidpd.profiles import profiles_dir
from fluidpd_operator.deployment import DeploymentController
from tests.operator.test_controller_failures import FakeKube, FakeSidecar, _workers, run

SHIPPED = (profiles_dir() / "llama-3.1-8b-a100-80gb.yaml").read_text()


def _fleet() -> list[FakeSidecar]:
    return _workers(Role.PREFILL, Role.DECODE)


def test_the_operator_forecasts_with_the_shipped_profile_and_the_deployments_slo() -> None:
    async def scenario(ctl: DeploymentController, kube: FakeKube, _: Any) -> None:
        await ctl.load_profile()
        role = ctl._controller().role
        assert role.predictive
        assert ctl.profile is not None and ctl.profile.model == "llama-3.1-8b"
        assert role.policy.model is not None
        assert role.policy.model.slo.ttft == 1.5 and role.policy.model.slo.tpot == 0.08

    run(_fleet(), scenario, slo={"ttftSeconds": 1.5, "tpotSeconds": 0.08})


def test_the_profile_configmap_is_what_the_operator_forecasts_with() -> None:
    custom = SHIPPED.replace("capacity_tokens:", "capacity_tokens: 123456 #", 1)
    assert custom != SHIPPED

    async def scenario(ctl: DeploymentController, kube: FakeKube, _: Any) -> None:
        kube.configmaps["prof"] = {"data": {"profile.yaml": custom}}
        await ctl.load_profile()
        assert ctl.profile is not None and ctl.profile.kv.capacity_tokens == 123456
        role = ctl._controller().role
        assert role.predictive and role.policy.model is not None
        assert role.policy.model.kv_capacity == 123456

    run(_fleet(), scenario, model={"name": "llama-3.1-8b", "profileConfigMap": "prof"})


def test_an_unreadable_profile_leaves_the_paper_rule_and_an_api_error_is_retried() -> None:
    async def scenario(ctl: DeploymentController, kube: FakeKube, _: Any) -> None:
        # The ConfigMap is not there yet: the paper rule for now, and asked again.
        await ctl.load_profile()
        first = ctl._controller()
        assert ctl.profile is None and not first.role.predictive
        kube.configmaps["prof"] = {"data": {"profile.yaml": SHIPPED}}
        await ctl.load_profile()
        second = ctl._controller()
        assert second is not first and second.role.predictive
        # A new spec whose ConfigMap holds no valid profile: the paper rule, not retried.
        kube.configmaps["bad"] = {"data": {"profile.yaml": "model: [unclosed"}}
        body = dict(ctl.body)
        body["spec"] = {**ctl.body["spec"], "model": {"name": "x", "profileConfigMap": "bad"}}
        ctl.update(body)
        await ctl.load_profile()
        assert ctl.profile is None and not ctl._controller().role.predictive
        kube.configmaps["bad"] = {"data": {"profile.yaml": SHIPPED}}
        await ctl.load_profile()
        assert ctl.profile is None

    run(_fleet(), scenario, model={"name": "llama-3.1-8b", "profileConfigMap": "prof"})
