"""The Helm chart (helm/fluidpd), linted and rendered by the real ``helm`` binary.

Every rendering is parsed and checked object by object: kinds, exact RBAC rules per scope,
the operator's command line and security context, the CRD as an exact copy of crds/, the
peering objects, the monitoring objects only with the Prometheus operator's API, one dashboard
ConfigMap per dashboard file, and the values schema's refusals."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "fluidpd"
NS = "fluidpd-system"
CRD_SOURCE = ROOT / "crds" / "fluidpd.io_fluidpddeployments.yaml"
CRD_COPY = CHART / "files" / "fluidpd.io_fluidpddeployments.yaml"
MONITORING = "monitoring.coreos.com/v1"

NAMESPACED_RULES = [
    {
        "apiGroups": ["fluidpd.io"],
        "resources": [
            "fluidpddeployments",
            "fluidpddeployments/status",
            "fluidpddeployments/scale",
        ],
        "verbs": ["get", "list", "watch", "patch", "update"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "delete", "patch"],
    },
    {
        "apiGroups": [""],
        "resources": ["services"],
        "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
    },
    {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
]
CRD_READ = {
    "apiGroups": ["apiextensions.k8s.io"],
    "resources": ["customresourcedefinitions"],
    "verbs": ["get", "list", "watch"],
}
NAMESPACE_WATCH = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}


def peering_rule(resource: str) -> dict[str, Any]:
    verbs = ["get", "list", "watch", "patch"]
    return {"apiGroups": ["kopf.dev"], "resources": [resource], "verbs": verbs}


def render(helm: str, *args: str, ok: bool = True) -> list[dict[str, Any]] | str:
    proc = subprocess.run(
        [helm, "template", "rel", str(CHART), "--namespace", NS, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if not ok:
        assert proc.returncode != 0, "helm template accepted values it should refuse"
        return proc.stderr
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def objects(helm: str, *args: str) -> list[dict[str, Any]]:
    out = render(helm, *args)
    assert isinstance(out, list)
    return out


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    dep = one(docs, "Deployment")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return container


def operator_argv(container: dict[str, Any]) -> list[str]:
    """The operator's effective argv after the shell wrapper (when there is one)."""
    if container["command"] == ["/bin/sh", "-c"]:
        script, _argv0, *rest = container["args"]
        assert script.startswith("exec fluidpd operator --priority ")
        assert script.endswith('"$@"')
        return ["operator", "--priority", "<random>", *rest]
    assert container["command"] == ["fluidpd"]
    return list(container["args"])


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


# --- without helm -----------------------------------------------------------------------------


def test_chart_crd_is_a_byte_identical_copy_of_crds() -> None:
    assert CRD_COPY.read_bytes() == CRD_SOURCE.read_bytes(), (
        "helm/fluidpd/files/ has a stale copy of the CRD: run `make chart-crds`"
    )


def test_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


def test_values_schema_is_strict() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    for key in ("image", "crds", "operator", "rbac", "peering", "prometheusRule"):
        assert schema["properties"][key]["additionalProperties"] is False, key
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])


# --- helm lint ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["--set", "rbac.scope=namespace", "--set", "watchNamespaces={team-a,team-b}"],
        [
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "grafana.dashboards.enabled=true",
            "--set",
            "operator.replicas=3",
        ],
    ],
    ids=["defaults", "namespace-scope", "monitoring-ha"],
)
def test_helm_lint_strict(helm: str, values: list[str]) -> None:
    proc = subprocess.run(
        [helm, "lint", "--strict", str(CHART), *values],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


# --- default rendering -------------------------------------------------------------------------


def test_default_objects(helm: str) -> None:
    docs = objects(helm)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Service",
            "ClusterKopfPeering",
        ]
    )
    for d in docs:
        assert d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        if d["kind"] in ("ServiceAccount", "Deployment", "Service"):
            assert d["metadata"]["namespace"] == NS


def test_crd_is_the_repository_crd_plus_release_metadata(helm: str) -> None:
    crd = one(objects(helm), "CustomResourceDefinition")
    source = yaml.safe_load(CRD_SOURCE.read_text())
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["name"] == "fluidpddeployments.fluidpd.io"
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    labels = crd["metadata"]["labels"]
    assert source["metadata"].get("labels", {}).items() <= labels.items()
    assert labels["app.kubernetes.io/instance"] == "rel"


def test_crd_install_and_keep_switches(helm: str) -> None:
    assert not by_kind(objects(helm, "--set", "crds.install=false"), "CustomResourceDefinition")
    crd = one(objects(helm, "--set", "crds.keep=false"), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_cluster_rbac_is_exactly_least_privilege(helm: str) -> None:
    docs = objects(helm)
    role = one(docs, "ClusterRole")
    assert role["rules"] == [
        *NAMESPACED_RULES,
        peering_rule("clusterkopfpeerings"),
        CRD_READ,
        NAMESPACE_WATCH,
    ]
    binding = one(docs, "ClusterRoleBinding")
    sa = one(docs, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NS}
    ]
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")


def test_operator_deployment(helm: str) -> None:
    docs = objects(helm)
    dep = one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 1
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    c = operator_container(docs)
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["image"] == "ghcr.io/fluidpd/operator:0.1.0"
    argv = operator_argv(c)
    assert argv[0] == "operator"
    assert flag_values(argv, "--peering") == ["fluidpd"]
    assert flag_values(argv, "--namespace") == []  # the whole cluster
    (liveness,) = flag_values(argv, "--liveness")
    port = next(p for p in c["ports"] if p["name"] == "health")["containerPort"]
    assert liveness == f"http://0.0.0.0:{port}/healthz"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    # The controllers' metrics: a port, a Service for it, and the scrape annotations.
    (metrics_port,) = flag_values(argv, "--metrics-port")
    assert {"name": "metrics", "containerPort": int(metrics_port), "protocol": "TCP"} in c["ports"]
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == metrics_port
    svc = one(docs, "Service")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": int(metrics_port), "targetPort": "metrics", "protocol": "TCP"}
    ]
    env = {e["name"]: e.get("value") for e in c["env"]}
    # One image for the router and sim workers (images/fluidpd).
    assert env["FLUIDPD_SIDECAR_IMAGE"] == "ghcr.io/fluidpd/fluidpd:0.1.0"
    assert env["FLUIDPD_ROUTER_IMAGE"] == "ghcr.io/fluidpd/fluidpd:0.1.0"
    assert env["FLUIDPD_SGLANG_IMAGE"] == "ghcr.io/fluidpd/sglang-worker:0.1.0"
    assert env["FLUIDPD_LOG_LEVEL"] == "info"
    # The read-only root filesystem leaves a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]


def test_operator_metrics_off(helm: str) -> None:
    docs = objects(helm, "--set", "operator.metrics.enabled=false")
    assert not by_kind(docs, "Service")
    c = operator_container(docs)
    assert flag_values(operator_argv(c), "--metrics-port") == []
    assert [p["name"] for p in c["ports"]] == ["health"]
    err = render(helm, "--set", "operator.metrics.port=8080", ok=False)
    assert "operator.metrics.port and operator.livenessPort must differ" in err


def test_fixed_priority_and_ha_replicas(helm: str) -> None:
    c = operator_container(objects(helm, "--set", "operator.priority=7"))
    assert flag_values(operator_argv(c), "--priority") == ["7"]
    docs = objects(helm, "--set", "operator.replicas=3")
    assert one(docs, "Deployment")["spec"]["replicas"] == 3
    script = operator_container(docs)["args"][0]
    assert '--priority "$(shuf -i 1-1000000000 -n 1)"' in script
    err = render(helm, "--set", "operator.replicas=2", "--set", "operator.priority=5", ok=False)
    assert 'operator.priority must be "random" when operator.replicas > 1' in err


def test_kopf_peering_crds_ship_in_crds_dir(helm: str) -> None:
    docs = objects(helm, "--include-crds")
    crds = {d["metadata"]["name"]: d for d in by_kind(docs, "CustomResourceDefinition")}
    assert set(crds) == {
        "fluidpddeployments.fluidpd.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }
    for name, scope, kind in (
        ("clusterkopfpeerings.kopf.dev", "Cluster", "ClusterKopfPeering"),
        ("kopfpeerings.kopf.dev", "Namespaced", "KopfPeering"),
    ):
        spec = crds[name]["spec"]
        assert spec["group"] == "kopf.dev"
        assert spec["scope"] == scope
        assert spec["names"]["kind"] == kind
        (version,) = spec["versions"]
        assert version["name"] == "v1" and version["served"] and version["storage"]
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True
    peering = one(docs, "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert peering["metadata"]["name"] == "fluidpd"
    assert "namespace" not in peering["metadata"]


# --- namespace scope ---------------------------------------------------------------------------


def test_namespace_scope_rbac(helm: str) -> None:
    docs = objects(
        helm,
        "--set",
        "rbac.scope=namespace",
        "--set",
        "watchNamespaces={team-a,team-b}",
        "--set",
        "peering.name=fpd-peers",
    )
    # Cluster-wide, the operator may only read CRDs.
    cluster_role = one(docs, "ClusterRole")
    assert cluster_role["rules"] == [CRD_READ]
    assert one(docs, "ClusterRoleBinding")["roleRef"]["name"] == cluster_role["metadata"]["name"]
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert role["rules"] == [*NAMESPACED_RULES, peering_rule("kopfpeerings")]
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    sa = one(docs, "ServiceAccount")["metadata"]["name"]
    for b in bindings:
        assert b["roleRef"]["kind"] == "Role"
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NS}]
    peerings = by_kind(docs, "KopfPeering")
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings) == [
        ("team-a", "fpd-peers"),
        ("team-b", "fpd-peers"),
    ]
    assert not by_kind(docs, "ClusterKopfPeering")
    argv = operator_argv(operator_container(docs))
    assert flag_values(argv, "--namespace") == ["team-a", "team-b"]
    assert flag_values(argv, "--peering") == ["fpd-peers"]


def test_namespace_scope_defaults_to_the_release_namespace(helm: str) -> None:
    docs = objects(helm, "--set", "rbac.scope=namespace")
    (role,) = by_kind(docs, "Role")
    assert role["metadata"]["namespace"] == NS
    (peering,) = by_kind(docs, "KopfPeering")
    assert peering["metadata"]["namespace"] == NS
    assert flag_values(operator_argv(operator_container(docs)), "--namespace") == [NS]


def test_cluster_scope_with_watched_namespaces(helm: str) -> None:
    docs = objects(helm, "--set", "watchNamespaces={team-a}")
    role = one(docs, "ClusterRole")
    # Watching a namespace list: namespaced peering, and no need to follow all namespaces.
    assert role["rules"] == [*NAMESPACED_RULES, peering_rule("kopfpeerings"), CRD_READ]
    assert [p["metadata"]["namespace"] for p in by_kind(docs, "KopfPeering")] == ["team-a"]
    assert flag_values(operator_argv(operator_container(docs)), "--namespace") == ["team-a"]


# --- monitoring ----------------------------------------------------------------------------------

MONITORING_ON = [
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "prometheusRule.enabled=true",
    "--set",
    "grafana.dashboards.enabled=true",
]


def test_monitoring_objects_need_the_prometheus_operator_api(helm: str) -> None:
    without = objects(helm, *MONITORING_ON)
    assert not by_kind(without, "ServiceMonitor")
    assert not by_kind(without, "PrometheusRule")
    docs = objects(helm, *MONITORING_ON, "--api-versions", MONITORING)
    monitors = {m["metadata"]["name"]: m for m in by_kind(docs, "ServiceMonitor")}
    assert set(monitors) == {"rel-fluidpd", "rel-fluidpd-operator"}
    sm = monitors["rel-fluidpd"]
    assert sm["spec"]["selector"] == {
        "matchLabels": {"app.kubernetes.io/name": "fluidpd"},
        "matchExpressions": [
            {"key": "app.kubernetes.io/component", "operator": "In", "values": ["worker", "router"]}
        ],
    }
    assert sm["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    assert {
        "sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_instance"],
        "targetLabel": "fluidpd_deployment",
    } in endpoint["relabelings"]
    operator_sm = monitors["rel-fluidpd-operator"]
    svc = one(docs, "Service")
    selector = operator_sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= svc["metadata"]["labels"].items()
    assert operator_sm["spec"]["namespaceSelector"] == {"matchNames": [NS]}
    assert [e["port"] for e in operator_sm["spec"]["endpoints"]] == ["metrics"]
    rule = one(docs, "PrometheusRule")
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    records = {r["record"] for r in rules if "record" in r}
    assert "fluidpd:slo_attainment:ratio_rate5m" in records
    assert {r["alert"] for r in rules if "alert" in r} == {
        "FluidPDSLOAttainmentLow",
        "FluidPDRoleSwitchStuck",
        "FluidPDCapacityExhausted",
    }
    low = next(r for r in rules if r.get("alert") == "FluidPDSLOAttainmentLow")
    assert low["expr"].strip().endswith("< 0.9")


def test_service_monitor_follows_watched_namespaces(helm: str) -> None:
    docs = objects(
        helm, *MONITORING_ON, "--api-versions", MONITORING, "--set", "watchNamespaces={team-a}"
    )
    monitors = {m["metadata"]["name"]: m for m in by_kind(docs, "ServiceMonitor")}
    workers = monitors["rel-fluidpd"]
    assert workers["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}


def test_one_dashboard_configmap_per_dashboard_file(helm: str) -> None:
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert {f.name for f in files} == {"fluidpd-slo.json", "fluidpd-controller.json"}
    assert not by_kind(objects(helm), "ConfigMap")
    maps = by_kind(objects(helm, *MONITORING_ON), "ConfigMap")
    assert len(maps) == len(files)
    data = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == NS
        data.update(cm["data"])
    for f in files:
        assert json.loads(data[f.name]) == json.loads(f.read_text())


# --- the schema's refusals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("rbac.scope=everywhere", "at '/rbac/scope': value must be one of 'cluster', 'namespace'"),
        ("operator.replica=2", "additional properties 'replica' not allowed"),
        ("operator.replicas=-1", "at '/operator/replicas': minimum: got -1"),
        (
            "operator.podSecurityContext.runAsNonRoot=false",
            "at '/operator/podSecurityContext/runAsNonRoot': value must be true",
        ),
        ("prometheusRule.sloTarget=1.5", "at '/prometheusRule/sloTarget': maximum: got 1.5"),
        ("prometheusRule.sloTarget=0", "at '/prometheusRule/sloTarget': exclusiveMinimum: got 0"),
        ("prometheusRule.window=five minutes", "at '/prometheusRule/window'"),
        ("watchNamespaces={Bad_Name}", "at '/watchNamespaces/0'"),
        ("image.operator.tag=latest", "the tag 'latest' is not allowed"),
    ],
)
def test_bad_values_are_refused_clearly(helm: str, setting: str, message: str) -> None:
    # --set-json keeps numbers numbers (--set makes 1.5 a string).
    key, value = setting.split("=", 1)
    try:
        args = ["--set-json", f"{key}={json.dumps(json.loads(value))}"]
    except ValueError:
        args = ["--set", setting]
    err = render(helm, *args, ok=False)
    assert isinstance(err, str)
    assert message in err, err
