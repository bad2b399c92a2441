"""Writes the Grafana dashboards the chart ships (``helm/fluidpd/dashboards/*.json``).

The JSON files are generated so that every panel follows the same conventions (datasource and
filter variables, units, legends); edit this script and run ``make dashboards``, never the JSON.
``tests/monitoring`` checks that the files are this script's output and evaluates every query
against Prometheus scraping a live stack.

Label conventions (set by the chart's ServiceMonitor, or by the test's scrape config):
``namespace`` and ``fluidpd_deployment`` on every scraped worker and router series; the
controller's own series carry ``fluidpd_namespace`` and ``fluidpd_deployment`` themselves.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "helm" / "fluidpd" / "dashboards"

DS = {"type": "prometheus", "uid": "${datasource}"}
#: Worker and router series of the selected deployment(s).
SEL = 'namespace=~"$namespace", fluidpd_deployment=~"$deployment"'
#: ... of the selected workers.
WSEL = SEL + ', worker=~"$worker"'
#: The controller's own series.
CSEL = 'fluidpd_namespace=~"$namespace", fluidpd_deployment=~"$deployment"'


class Board:
    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.row_h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "id": len(self.panels) + 1,
                "panels": [],
            }
        )
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def panel(
        self,
        kind: str,
        title: str,
        targets: list[tuple[str, str]],
        *,
        w: int = 12,
        h: int = 8,
        unit: str = "short",
        description: str = "",
        **options: Any,
    ) -> None:
        if self.x + w > 24:
            self._newline()
        panel: dict[str, Any] = {
            "type": kind,
            "title": title,
            "description": description,
            "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "id": len(self.panels) + 1,
            "targets": [
                {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(65 + i)}
                for i, (expr, legend) in enumerate(targets)
            ],
            "fieldConfig": {"defaults": {"unit": unit, **options.pop("defaults", {})}},
            "options": options.pop("options", {}),
        }
        panel["fieldConfig"]["overrides"] = options.pop("overrides", [])
        panel.update(options)
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def _variables(worker: bool) -> list[dict[str, Any]]:
    def query(name: str, label: str, expr: str, multi: bool) -> dict[str, Any]:
        q = f"label_values({expr}, {label})"
        return {
            "name": name,
            "label": name,
            "type": "query",
            "datasource": DS,
            "definition": q,
            "query": {"query": q, "refId": f"{name}-query", "qryType": 1},
            "refresh": 2,
            "sort": 1,
            "multi": multi,
            "includeAll": multi,
            "allValue": ".*" if multi else None,
            "current": {},
            "options": [],
            "hide": 0,
        }

    out: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "options": [],
            "refresh": 1,
            "regex": "",
        },
        query("namespace", "namespace", "fluidpd_worker_role", False),
        query(
            "deployment",
            "fluidpd_deployment",
            'fluidpd_worker_role{namespace=~"$namespace"}',
            False,
        ),
    ]
    if worker:
        out.append(query("worker", "worker", f"fluidpd_worker_role{{{SEL}}}", True))
    out.append(
        {
            "name": "window",
            "label": "Attainment window",
            "type": "interval",
            "query": "1m,5m,15m,1h",
            "current": {"selected": True, "text": "5m", "value": "5m"},
            "options": [
                {"selected": v == "5m", "text": v, "value": v} for v in ("1m", "5m", "15m", "1h")
            ],
            "auto": False,
            "hide": 0,
            "refresh": 2,
        }
    )
    return out


def _switch_annotation() -> dict[str, Any]:
    return {
        "name": "Role switches",
        "datasource": DS,
        "enable": True,
        "iconColor": "orange",
        "expr": f"changes(fluidpd_role_switches_total{{{SEL}}}[1m]) > 0",
        "step": "15s",
        "titleFormat": "{{worker}}: {{source}} -> {{target}}",
        "textFormat": "role switch (FluidRole)",
        "tagKeys": "worker,source,target",
        "useValueForTime": False,
    }


def _dashboard(
    uid: str, title: str, description: str, board: Board, worker: bool
) -> dict[str, Any]:
    return {
        "__inputs": [],
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["fluidpd", "llm-serving", "slo"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "links": [],
        "templating": {"list": _variables(worker)},
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                _switch_annotation(),
            ]
        },
        "panels": board.panels,
    }


def _ratio(slo: str, window: str, sel: str = SEL) -> str:
    met = f'fluidpd_slo_requests_total{{{sel}, slo="{slo}", outcome="met"}}'
    every = f'fluidpd_slo_requests_total{{{sel}, slo="{slo}"}}'
    return f"sum(increase({met}[{window}])) / sum(increase({every}[{window}]))"


def _quantiles(metric: str, sel: str, by: str = "") -> list[tuple[str, str]]:
    group = f"le{', ' + by if by else ''}"
    return [
        (
            f"histogram_quantile({q}, sum by ({group}) "
            f"(rate({metric}_bucket{{{sel}}}[$__rate_interval])))",
            f"p{round(q * 100)}" + (f" {{{{{by}}}}}" if by else ""),
        )
        for q in (0.5, 0.9, 0.99)
    ]


PERCENT = {"min": 0, "max": 1}


def slo_dashboard() -> dict[str, Any]:
    b = Board()
    b.row("SLO attainment")
    for slo, title in (
        ("all", "SLO attainment (TTFT and TPOT)"),
        ("ttft", "TTFT attainment"),
        ("tpot", "TPOT attainment"),
    ):
        b.panel(
            "stat",
            f"{title}, dashboard range",
            [(_ratio(slo, "$__range"), slo)],
            w=5,
            h=5,
            unit="percentunit",
            description="Share of finished requests within the worker's target, counted "
            "per request by the decode sidecar (fluidpd_slo_requests_total).",
            defaults={
                **PERCENT,
                "thresholds": {
                    "mode": "absolute",
                    "steps": [
                        {"color": "red", "value": None},
                        {"color": "orange", "value": 0.8},
                        {"color": "green", "value": 0.9},
                    ],
                },
            },
            options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background"},
        )
    b.panel(
        "stat",
        "SLO targets",
        [(f"max by (slo) (fluidpd_slo_target_seconds{{{SEL}}})", "{{slo}}")],
        w=4,
        h=5,
        unit="s",
        options={"reduceOptions": {"calcs": ["lastNotNull"]}},
    )
    b.panel(
        "stat",
        "Requests finished, dashboard range",
        [
            (
                f'sum(increase(fluidpd_slo_requests_total{{{SEL}, slo="all"}}[$__range]))',
                "finished",
            )
        ],
        w=5,
        h=5,
        options={"reduceOptions": {"calcs": ["lastNotNull"]}},
    )
    b.panel(
        "timeseries",
        "SLO attainment over $window",
        [(_ratio(s, "$window"), s) for s in ("all", "ttft", "tpot")],
        w=24,
        unit="percentunit",
        defaults=PERCENT,
        description="Attainment over a sliding window; the role-switch annotations mark "
        "FluidRole's in-place switches.",
    )
    b.row("Latency")
    b.panel(
        "timeseries",
        "TTFT percentiles (decode sidecars)",
        [
            *_quantiles("fluidpd_ttft_seconds", WSEL),
            (f'max(fluidpd_slo_target_seconds{{{SEL}, slo="ttft"}})', "target"),
        ],
        unit="s",
    )
    b.panel(
        "timeseries",
        "TPOT percentiles (decode sidecars)",
        [
            *_quantiles("fluidpd_tpot_seconds", WSEL),
            (f'max(fluidpd_slo_target_seconds{{{SEL}, slo="tpot"}})', "target"),
        ],
        unit="s",
    )
    b.panel(
        "timeseries",
        "TTFT at the router",
        _quantiles("fluidpd_router_ttft_seconds", SEL),
        w=8,
        unit="s",
    )
    b.panel(
        "timeseries",
        "Prefill queueing time",
        _quantiles("fluidpd_queue_time_seconds", WSEL),
        w=8,
        unit="s",
    )
    b.panel(
        "timeseries",
        "End-to-end latency",
        _quantiles("fluidpd_e2e_seconds", WSEL),
        w=8,
        unit="s",
    )
    b.row("Prefill : decode split")
    b.panel(
        "timeseries",
        "Workers per role (P:D split)",
        [(f"sum by (role) (fluidpd_worker_role{{{SEL}}})", "{{role}}")],
        w=12,
        defaults={"custom": {"stacking": {"mode": "normal"}, "fillOpacity": 40}, "decimals": 0},
    )
    b.panel(
        "state-timeline",
        "Role and state per worker",
        [
            # 0 prefill, 1 decode; + 2 while the worker drains or switches.
            (
                f'max by (worker) (fluidpd_worker_role{{{WSEL}, role="decode"}})'
                f' + 2 * max by (worker) (fluidpd_worker_role{{{WSEL}, state!="active"}} * 0 + 1)'
                f' or max by (worker) (fluidpd_worker_role{{{WSEL}, role="decode"}})',
                "{{worker}}",
            )
        ],
        w=12,
        defaults={
            "mappings": [
                {
                    "type": "value",
                    "options": {
                        "0": {"text": "prefill", "color": "blue", "index": 0},
                        "1": {"text": "decode", "color": "green", "index": 1},
                        "2": {"text": "prefill (draining)", "color": "orange", "index": 2},
                        "3": {"text": "decode (draining)", "color": "orange", "index": 3},
                    },
                }
            ],
            "color": {"mode": "thresholds"},
        },
    )
    b.row("Pressure")
    b.panel(
        "timeseries",
        "PPI per worker (queue, eq. 5)",
        [
            (f"fluidpd_ppi{{{WSEL}}}", "{{worker}}"),
            (f"fluidpd_ppi_attributable{{{WSEL}}}", "{{worker}} attributable"),
        ],
        w=12,
        description="> 1: the worker's prefill queue is predicted to miss TTFT deadlines.",
    )
    b.panel(
        "timeseries",
        "DPI per worker (load eq. 7, admission eq. 8)",
        [
            (f"fluidpd_dpi_load{{{WSEL}}}", "{{worker}} load"),
            (f"fluidpd_dpi_adm{{{WSEL}}}", "{{worker}} admission"),
        ],
        w=12,
    )
    b.row("Queues, KV, FluidToken")
    b.panel(
        "timeseries",
        "Queue length and running batch",
        [
            (f"fluidpd_queue_length{{{WSEL}}}", "{{worker}} queue"),
            (f"fluidpd_running_batch{{{WSEL}}}", "{{worker}} batch"),
        ],
        w=8,
    )
    b.panel(
        "timeseries",
        "KV usage (used + reserved) / capacity",
        [
            (
                f"(fluidpd_kv_used_tokens{{{WSEL}}} + fluidpd_kv_reserved_tokens{{{WSEL}}})"
                f" / fluidpd_kv_capacity_tokens{{{WSEL}}}",
                "{{worker}}",
            )
        ],
        w=8,
        unit="percentunit",
        defaults=PERCENT,
    )
    b.panel(
        "timeseries",
        "KV hand-off rate",
        [
            (
                f"sum by (worker) (rate(fluidpd_kv_sent_bytes_total{{{WSEL}}}[$__rate_interval]))",
                "{{worker}}",
            )
        ],
        w=8,
        unit="Bps",
    )
    b.panel(
        "timeseries",
        "Stolen prompt tokens (FluidToken), per second",
        [
            (
                f"sum by (worker) (rate(fluidpd_stolen_tokens{{{WSEL}}}[$__rate_interval]))",
                "{{worker}}",
            )
        ],
        w=12,
        description="Prompt tokens a prefill worker's queue handed to decode workers as "
        "suffixes (fluidpd_stolen_tokens is a running total).",
    )
    b.panel(
        "timeseries",
        "Advertised stealing budget (eq. 17)",
        [(f"fluidpd_steal_budget_tokens{{{WSEL}}}", "{{worker}}")],
        w=12,
    )
    b.row("Router")
    b.panel(
        "timeseries",
        "Requests by outcome",
        [
            (
                f"sum by (status) (rate(fluidpd_router_requests_total{{{SEL}}}[$__rate_interval]))",
                "HTTP {{status}}",
            )
        ],
        w=12,
        unit="reqps",
    )
    b.panel(
        "timeseries",
        "In flight and re-paired",
        [
            (f"sum(fluidpd_router_inflight{{{SEL}}})", "in flight"),
            (f"sum(fluidpd_router_repairings{{{SEL}}})", "re-paired (total)"),
        ],
        w=12,
    )
    return _dashboard(
        "fluidpd-slo",
        "FluidPD / SLO",
        "Per FluidPDDeployment: SLO attainment, latency percentiles, the P:D split with role "
        "switches, PPI/DPI, queues, KV and FluidToken.",
        b,
        worker=True,
    )


def controller_dashboard() -> dict[str, Any]:
    b = Board()
    b.row("FluidRole decisions")
    b.panel(
        "stat",
        "Role switches, dashboard range",
        [(f"sum(increase(fluidpd_role_switches_total{{{SEL}}}[$__range]))", "switches")],
        w=6,
        h=5,
        options={"reduceOptions": {"calcs": ["lastNotNull"]}},
    )
    b.panel(
        "stat",
        "NEEDS_CAPACITY intervals, dashboard range",
        [
            (
                "sum(increase(fluidpd_controller_decisions_total"
                f'{{{CSEL}, decision="needs-capacity"}}[$__range]))',
                "needs-capacity",
            )
        ],
        w=6,
        h=5,
        description="Control intervals in which both phases were pressured: moving workers "
        "between roles cannot help; the autoscaler fallback (or you) must add capacity.",
        defaults={
            "thresholds": {
                "mode": "absolute",
                "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}],
            }
        },
        options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background"},
    )
    b.panel(
        "stat",
        "Switch in progress",
        [(f"max(fluidpd_controller_switch_in_progress{{{CSEL}}})", "switching")],
        w=6,
        h=5,
        options={"reduceOptions": {"calcs": ["lastNotNull"]}},
    )
    b.panel(
        "stat",
        "Workers not Active (drain/switch)",
        [(f'sum(fluidpd_worker_role{{{SEL}, state!="active"}}) or vector(0)', "not active")],
        w=6,
        h=5,
        options={"reduceOptions": {"calcs": ["lastNotNull"]}},
    )
    b.panel(
        "timeseries",
        "Decisions per control interval outcome",
        [
            (
                "sum by (decision) (increase(fluidpd_controller_decisions_total"
                f"{{{CSEL}}}[$window]))",
                "{{decision}}",
            )
        ],
        w=12,
    )
    b.panel(
        "timeseries",
        "Controller events",
        [
            (
                f"sum by (kind) (increase(fluidpd_controller_events_total{{{CSEL}}}[$window]))",
                "{{kind}}",
            )
        ],
        w=12,
    )
    b.row("Switches")
    b.panel(
        "timeseries",
        "Completed switches per direction (sidecars)",
        [
            (
                "sum by (source, target) (increase(fluidpd_role_switches_total"
                f"{{{SEL}}}[$window]))",
                "{{source}} -> {{target}}",
            )
        ],
        w=12,
    )
    b.panel(
        "timeseries",
        "Drain + switch time, dashboard range",
        [
            (
                f"histogram_quantile({q}, sum by (le) "
                f"(increase(fluidpd_drain_seconds_bucket{{{SEL}}}[$__range])))",
                f"p{round(q * 100)} (sidecars)",
            )
            for q in (0.5, 0.95)
        ]
        + [
            (
                "histogram_quantile(0.95, sum by (le) "
                f"(increase(fluidpd_controller_switch_seconds_bucket{{{CSEL}}}[$__range])))",
                "p95 (controller)",
            )
        ],
        w=12,
        unit="s",
    )
    b.row("Pool pressure and workers")
    b.panel(
        "timeseries",
        "Pool pressure the policy acted on (PPI-bar eq. 20, DPI-bar eqs. 21-22)",
        [
            (
                f"max by (signal) (fluidpd_controller_pool_pressure{{{CSEL}}})",
                "{{signal}}",
            )
        ],
        w=12,
    )
    b.panel(
        "timeseries",
        "Workers answering the controller, by role",
        [(f"sum by (role) (fluidpd_controller_workers{{{CSEL}}})", "{{role}}")],
        w=12,
        defaults={"decimals": 0},
    )
    return _dashboard(
        "fluidpd-controller",
        "FluidPD / Controller",
        "The FluidRole controller: decisions, switches and their drain times, pool pressure, "
        "and NEEDS_CAPACITY (both phases pressured).",
        b,
        worker=False,
    )


DASHBOARDS = {"fluidpd-slo.json": slo_dashboard, "fluidpd-controller.json": controller_dashboard}


def render(name: str) -> str:
    return json.dumps(DASHBOARDS[name](), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail if a file is not up to date")
    args = p.parse_args(argv)
    stale = []
    OUT.mkdir(parents=True, exist_ok=True)
    for name in DASHBOARDS:
        path = OUT / name
        text = render(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
    if stale:
        print("stale (run `make dashboards`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
