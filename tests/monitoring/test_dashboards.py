"""The Grafana dashboards and the PrometheusRule, checked against real Prometheus.

Prometheus (built from the Go module proxy with the test plane's binaries and run as a child
process of this test: nothing is installed or left running) scrapes a live ``fluidpd up`` stack
(2P2D, the fluidpd policy, the controller serving its metrics) every second while open-loop
load flows and two role switches are forced; then every panel query, every template variable
query, the role-switch annotation and every rule of the chart's PrometheusRule are evaluated
through Prometheus' HTTP API with the dashboard variables set to the live values. Each must
evaluate without error and return data; promtool must accept the rules.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluidpd.drills.admin import admin_session
from fluidpd.drills.load import OpenLoopLoad
from fluidpd.drills.stack import LocalStack, free_port_block, wait_http
from fluidpd.drills.switches import switch_once
from harness.binaries import ensure_binaries

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "fluidpd"
DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
TOKEN = "monitoring-test-token"
MODEL = "llama-3.1-8b"
NAMESPACE, DEPLOYMENT = "local", "fluidpd"
LOAD_S = 24.0

#: Panels whose value is a quantile of switches the controller itself carried out: NaN (but
#: present) when the controller started none during the test (the forced switches go straight
#: to the sidecars).
MAY_BE_NAN = ("fluidpd_controller_switch_seconds_bucket",)


@dataclass
class Live:
    prom: str
    t_start: float
    t_eval: float
    workers: list[str]
    rules: list[dict[str, Any]]
    rules_file: Path
    promtool: Path
    completed: int
    switches: list[dict[str, Any]]

    def variables(self) -> dict[str, str]:
        return {
            "namespace": NAMESPACE,
            "deployment": DEPLOYMENT,
            "worker": "|".join(self.workers),
            "window": "1m",
            "__range": f"{math.ceil(self.t_eval - self.t_start) + 5}s",
            "__rate_interval": "15s",
            "__interval": "1s",
        }

    def substitute(self, expr: str) -> str:
        values = self.variables()
        for name in sorted(values, key=len, reverse=True):
            expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
        assert "$" not in expr.replace("$labels", "").replace("$value", ""), expr
        return expr

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        params = {"query": expr, "time": f"{self.t_eval if at is None else at:.3f}"}
        return _get(f"{self.prom}/api/v1/query?{urllib.parse.urlencode(params)}")

    def series(self, match: str) -> dict[str, Any]:
        """The series matching ``match`` over the run, as Grafana's ``label_values`` reads
        them (the series API over the dashboard's range, not an instant query)."""
        params = {"match[]": match, "start": self.t_start, "end": self.t_eval}
        return _get(f"{self.prom}/api/v1/series?{urllib.parse.urlencode(params)}")

    def query_range(self, expr: str) -> dict[str, Any]:
        params = {"query": expr, "start": self.t_start, "end": self.t_eval, "step": "1"}
        return _get(f"{self.prom}/api/v1/query_range?{urllib.parse.urlencode(params)}")


def _get(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            data: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
        data = json.loads(exc.read())
    return data


def _wait_scraping(prom: str, targets: int, timeout: float = 60.0) -> None:
    """Until every target has been scraped (Prometheus applies new targets every 5 s)."""
    query = urllib.parse.urlencode({"query": "sum(up)"})
    deadline = time.time() + timeout
    while time.time() < deadline:
        result = _get(f"{prom}/api/v1/query?{query}")["data"]["result"]
        if result and float(result[0]["value"][1]) == targets:
            return
        time.sleep(0.5)
    raise TimeoutError(f"Prometheus did not scrape all {targets} targets in {timeout:g} s")


def _rendered_rules(helm: Path, tmp: Path) -> tuple[list[dict[str, Any]], Path]:
    """The chart's PrometheusRule groups, as a Prometheus rules file."""
    out = subprocess.run(
        [
            helm, "template", "rel", str(CHART), "--api-versions", "monitoring.coreos.com/v1",
            "--set", "prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml",
        ],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    groups = yaml.safe_load(out)["spec"]["groups"]
    path = tmp / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return groups, path


async def _drive(stack: LocalStack) -> tuple[int, list[dict[str, Any]]]:
    """Open-loop load for LOAD_S seconds; meanwhile one P->D and one D->P switch."""
    load = OpenLoopLoad(stack.endpoint, MODEL, rps=4.0, max_tokens=(10, 60), seed=1)
    task = asyncio.create_task(load.run(LOAD_S))
    switches = []
    async with admin_session(TOKEN) as session:
        await asyncio.sleep(4.0)
        for source in ("prefill", "decode"):
            done = await switch_once(session, stack.endpoint, TOKEN, source, "wait", 30.0)
            if done is not None:
                switches.append(done)
    report = await task
    return report.summary(60.0)["completed"], switches


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    # prometheus, promtool and helm: built once by e2e/testplane/build-binaries.sh (cached).
    bin_dir = ensure_binaries(("helm", "prometheus", "promtool"))
    tmp = tmp_path_factory.mktemp("monitoring")
    rules, rules_file = _rendered_rules(bin_dir / "helm", tmp)
    ctl_port = free_port_block(1)
    with LocalStack(
        tmp / "up",
        "2P2D",
        "fluidpd",
        "--controller-metrics-port",
        str(ctl_port),
        token=TOKEN,
    ) as stack:
        labels = {"namespace": NAMESPACE, "fluidpd_deployment": DEPLOYMENT}

        def hosts(urls: list[str]) -> list[str]:
            return [u.removeprefix("http://") for u in urls]

        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_file)],
            "scrape_configs": [
                {
                    "job_name": "worker",
                    "static_configs": [
                        {"targets": hosts(list(stack.workers.values())), "labels": labels}
                    ],
                },
                {
                    "job_name": "router",
                    "static_configs": [{"targets": hosts([stack.endpoint]), "labels": labels}],
                },
                # The controller labels its own series with the deployment (--deployment).
                {
                    "job_name": "controller",
                    "static_configs": [{"targets": [f"127.0.0.1:{ctl_port}"]}],
                },
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port_block(1)
        prom = f"http://127.0.0.1:{port}"
        log = (tmp / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [
                str(bin_dir / "prometheus"),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_http(f"{prom}/-/ready", 60)
            _wait_scraping(prom, len(stack.workers) + 2)
            t_start = time.time()
            completed, switches = asyncio.run(_drive(stack))
            # A moment inside the load, and a few scrapes after it so the samples are in.
            t_eval = time.time() - 2.0
            time.sleep(4.0)
            yield Live(
                prom,
                t_start,
                t_eval,
                sorted(stack.workers),
                rules,
                rules_file,
                bin_dir / "promtool",
                completed,
                switches,
            )
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _result_values(data: dict[str, Any]) -> list[float]:
    result = data["data"]["result"]
    if data["data"]["resultType"] == "scalar":
        return [float(result[1])]
    return [float(v) for s in result for _, v in ([s["value"]] if "value" in s else s["values"])]


def _targets() -> list[tuple[str, str, str]]:
    out = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for t in panel.get("targets", []):
                out.append((path.stem, f"{panel['title']} [{t['refId']}]", t["expr"]))
    return out


# --- without a live stack ----------------------------------------------------------------------


def test_dashboards_are_the_generators_output() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_dashboards.py"), "--check"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_dashboard_model(path: Path) -> None:
    d = json.loads(path.read_text())
    assert d["uid"] == path.stem and d["schemaVersion"] == 39
    names = [v["name"] for v in d["templating"]["list"]]
    assert names[:3] == ["datasource", "namespace", "deployment"]
    assert "window" in names
    assert ("worker" in names) == (path.stem == "fluidpd-slo")
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for panel in d["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
            # Range queries, as the live test runs them.
            assert not any(t.get("instant") for t in panel["targets"]), panel["title"]
    switches = [a for a in d["annotations"]["list"] if a["name"] == "Role switches"]
    assert len(switches) == 1 and "fluidpd_role_switches_total" in switches[0]["expr"]


# --- against Prometheus scraping the live stack ------------------------------------------------


@pytest.mark.slow
def test_every_panel_query_returns_data(live: Live) -> None:
    # As Grafana runs them (no target asks for an instant query): over the dashboard's range.
    # An instant query read one moment, and a scrape that timed out on a loaded CI machine
    # left that moment without the router's series once.
    problems = []
    for board, title, expr in _targets():
        data = live.query_range(live.substitute(expr))
        if data.get("status") != "success":
            problems.append(f"{board} / {title}: {data.get('error')}")
            continue
        values = _result_values(data)
        if not values:
            problems.append(f"{board} / {title}: no data")
        elif all(math.isnan(v) for v in values) and not any(m in expr for m in MAY_BE_NAN):
            problems.append(f"{board} / {title}: only NaN")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_variable_queries_return_the_live_values(live: Live) -> None:
    expected = {"namespace": {NAMESPACE}, "deployment": {DEPLOYMENT}, "worker": set(live.workers)}
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", var["definition"])
            assert m, var["definition"]
            data = live.series(live.substitute(m.group(1)))
            assert data["status"] == "success", data
            found = {s.get(m.group(2)) for s in data["data"]}
            assert found == expected[var["name"]], (path.stem, var["name"], found)


@pytest.mark.slow
def test_role_switch_annotation_marks_the_switches(live: Live) -> None:
    assert any("error" not in s for s in live.switches), live.switches
    for path in DASHBOARDS:
        (ann,) = [
            a
            for a in json.loads(path.read_text())["annotations"]["list"]
            if a["name"] == "Role switches"
        ]
        data = live.query_range(live.substitute(ann["expr"]))
        assert data["status"] == "success", data
        marked = {s["metric"]["worker"] for s in data["data"]["result"]}
        switched = {s["worker"] for s in live.switches if "error" not in s}
        assert switched <= marked, (marked, live.switches)


@pytest.mark.slow
def test_slo_counters_count_every_completed_request(live: Live) -> None:
    """The new attainment counters: one finished request per request the client saw complete,
    in each of the ttft/tpot/all families."""
    assert live.completed > 0
    for slo in ("ttft", "tpot", "all"):
        # Each counter's latest value over the last scrapes: a scrape that timed out on the
        # loaded machine marks that worker's series stale, and an instant query then left
        # its requests out (55 of 109 once in CI).
        series = f'fluidpd_slo_requests_total{{slo="{slo}"}}'
        data = live.query(f"sum(max_over_time({series}[15s]))", at=time.time())
        assert _result_values(data) == [float(live.completed)], slo


@pytest.mark.slow
def test_every_rule_evaluates_and_every_recording_has_data(live: Live) -> None:
    rules = [r for g in live.rules for r in g["rules"]]
    assert rules
    problems = []
    for rule in rules:
        name = rule.get("record") or rule["alert"]
        data = live.query(rule["expr"])
        if data.get("status") != "success":
            problems.append(f"{name}: {data.get('error')}")
        if "record" in rule:
            # Prometheus itself evaluated the recording rule (rule_files): the series exists.
            recorded = live.query(rule["record"])
            if recorded.get("status") != "success" or not _result_values(recorded):
                problems.append(f"{name}: nothing recorded")
            elif not _result_values(data):
                problems.append(f"{name}: no data")
    assert not problems, "\n".join(problems)
    loaded = _get(f"{live.prom}/api/v1/rules")["data"]["groups"]
    assert {g["name"] for g in loaded} == {g["name"] for g in live.rules}
    for group in loaded:
        for rule in group["rules"]:
            assert rule["health"] == "ok", rule


@pytest.mark.slow
def test_promtool_accepts_the_rules(live: Live) -> None:
    proc = subprocess.run(
        [str(live.promtool), "check", "rules", str(live.rules_file)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
