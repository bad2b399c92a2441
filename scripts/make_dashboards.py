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
from dataclasses import dataclass
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
#: A stat panel's value: the last one in range.
LAST = {"reduceOptions": {"calcs": ["lastNotNull"]}}
THRESHOLDS_ATTAINMENT = {
    "mode": "absolute",
    "steps": [
        {"color": "red", "value": None},
        {"color": "orange", "value": 0.8},
        {"color": "green", "value": 0.9},
    ],
}
THRESHOLDS_ANY = {
    "mode": "absolute",
    "steps": [{"color": "green", "value": None}, {"color": "red", "value": 1}],
}
#: The state-timeline's values: 0 prefill, 1 decode; + 2 while the worker drains or switches.
ROLE_STATES = {
    "0": {"text": "prefill", "color": "blue", "index": 0},
    "1": {"text": "decode", "color": "green", "index": 1},
    "2": {"text": "prefill (draining)", "color": "orange", "index": 2},
    "3": {"text": "decode (draining)", "color": "orange", "index": 3},
}


@dataclass(frozen=True)
class Panel:
    """One row of a dashboard's table: what ``Board.panel`` lays out."""

    kind: str
    title: str
    targets: list[tuple[str, str]]
    w: int = 12
    h: int = 8
    unit: str = "short"
    description: str = ""
    defaults: dict[str, Any] | None = None
    options: dict[str, Any] | None = None


def ts(title: str, targets: list[tuple[str, str]], w: int = 12, **kw: Any) -> Panel:
    return Panel("timeseries", title, targets, w, **kw)


def stat(title: str, targets: list[tuple[str, str]], w: int, **kw: Any) -> Panel:
    return Panel("stat", title, targets, w, 5, options=kw.pop("options", LAST), **kw)


def per_worker(*series: tuple[str, str]) -> list[tuple[str, str]]:
    """One line per selected worker for each (metric, legend suffix)."""
    return [(f"{m}{{{WSEL}}}", "{{worker}}" + (f" {s}" if s else "")) for m, s in series]


def rate_by(by: str, metric: str, sel: str = WSEL, window: str = "$__rate_interval") -> str:
    return f"sum by ({by}) (rate({metric}{{{sel}}}[{window}]))"


def increase_by(by: str, metric: str, sel: str, window: str) -> str:
    return f"sum by ({by}) (increase({metric}{{{sel}}}[{window}]))"


def _with_target(metric: str, slo: str) -> list[tuple[str, str]]:
    target = (f'max(fluidpd_slo_target_seconds{{{SEL}, slo="{slo}"}})', "target")
    return [*_quantiles(metric, WSEL), target]


_ATTAINMENT = "Share of finished requests within the worker's target, counted per request by \
the decode sidecar (fluidpd_slo_requests_total)."
_ROLE_STATE = (
    f'max by (worker) (fluidpd_worker_role{{{WSEL}, role="decode"}})'
    f' + 2 * max by (worker) (fluidpd_worker_role{{{WSEL}, state!="active"}} * 0 + 1)'
    f' or max by (worker) (fluidpd_worker_role{{{WSEL}, role="decode"}})'
)
_KV_SHARE = (
    f"(fluidpd_kv_used_tokens{{{WSEL}}} + fluidpd_kv_reserved_tokens{{{WSEL}}})"
    f" / fluidpd_kv_capacity_tokens{{{WSEL}}}"
)

#: Rows are titles; everything else a panel, laid out left to right, 24 columns a line.
SLO_PANELS: list[str | Panel] = [
    "SLO attainment",
    *[
        stat(f"{title}, dashboard range", [(_ratio(slo, "$__range"), slo)], 5,
             unit="percentunit", description=_ATTAINMENT,
             defaults={**PERCENT, "thresholds": THRESHOLDS_ATTAINMENT},
             options={**LAST, "colorMode": "background"})
        for slo, title in (("all", "SLO attainment (TTFT and TPOT)"), ("ttft", "TTFT attainment"),
                           ("tpot", "TPOT attainment"))
    ],
    stat("SLO targets", [(f"max by (slo) (fluidpd_slo_target_seconds{{{SEL}}})", "{{slo}}")], 4,
         unit="s"),
    stat("Requests finished, dashboard range",
         [(f'sum(increase(fluidpd_slo_requests_total{{{SEL}, slo="all"}}[$__range]))', "finished")],
         5),
    ts("SLO attainment over $window", [(_ratio(s, "$window"), s) for s in ("all", "ttft", "tpot")],
       24, unit="percentunit", defaults=PERCENT,
       description="Attainment over a sliding window; the role-switch annotations mark "
       "FluidRole's in-place switches."),
    "Latency",
    ts("TTFT percentiles (decode sidecars)", _with_target("fluidpd_ttft_seconds", "ttft"),
       unit="s"),
    ts("TPOT percentiles (decode sidecars)", _with_target("fluidpd_tpot_seconds", "tpot"),
       unit="s"),
    ts("TTFT at the router", _quantiles("fluidpd_router_ttft_seconds", SEL), 8, unit="s"),
    ts("Prefill queueing time", _quantiles("fluidpd_queue_time_seconds", WSEL), 8, unit="s"),
    ts("End-to-end latency", _quantiles("fluidpd_e2e_seconds", WSEL), 8, unit="s"),
    "Prefill : decode split",
    ts("Workers per role (P:D split)",
       [(f"sum by (role) (fluidpd_worker_role{{{SEL}}})", "{{role}}")],
       defaults={"custom": {"stacking": {"mode": "normal"}, "fillOpacity": 40}, "decimals": 0}),
    Panel("state-timeline", "Role and state per worker", [(_ROLE_STATE, "{{worker}}")],
          defaults={"mappings": [{"type": "value", "options": ROLE_STATES}],
                    "color": {"mode": "thresholds"}}),
    "Pressure",
    ts("PPI per worker (queue, eq. 5)",
       per_worker(("fluidpd_ppi", ""), ("fluidpd_ppi_attributable", "attributable")),
       description="> 1: the worker's prefill queue is predicted to miss TTFT deadlines."),
    ts("DPI per worker (load eq. 7, admission eq. 8)",
       per_worker(("fluidpd_dpi_load", "load"), ("fluidpd_dpi_adm", "admission"))),
    "Queues, KV, FluidToken",
    ts("Queue length and running batch",
       per_worker(("fluidpd_queue_length", "queue"), ("fluidpd_running_batch", "batch")), 8),
    ts("KV usage (used + reserved) / capacity", [(_KV_SHARE, "{{worker}}")], 8,
       unit="percentunit", defaults=PERCENT),
    ts("KV hand-off rate", [(rate_by("worker", "fluidpd_kv_sent_bytes_total"), "{{worker}}")], 8,
       unit="Bps"),
    ts("Stolen prompt tokens (FluidToken), per second",
       [(rate_by("worker", "fluidpd_stolen_tokens"), "{{worker}}")],
       description="Prompt tokens a prefill worker's queue handed to decode workers as "
       "suffixes (fluidpd_stolen_tokens is a running total)."),
    ts("Advertised stealing budget (eq. 17)", per_worker(("fluidpd_steal_budget_tokens", ""))),
    "Router",
    ts("Requests by outcome",
       [(rate_by("status", "fluidpd_router_requests_total", SEL), "HTTP {{status}}")],
       unit="reqps"),
    ts("In flight and re-paired",
       [(f"sum(fluidpd_router_inflight{{{SEL}}})", "in flight"),
        (f"sum(fluidpd_router_repairings{{{SEL}}})", "re-paired (total)")]),
]  # fmt: skip

CONTROLLER_PANELS: list[str | Panel] = [
    "FluidRole decisions",
    stat("Role switches, dashboard range",
         [(f"sum(increase(fluidpd_role_switches_total{{{SEL}}}[$__range]))", "switches")], 6),
    stat("NEEDS_CAPACITY intervals, dashboard range",
         [("sum(increase(fluidpd_controller_decisions_total"
           f'{{{CSEL}, decision="needs-capacity"}}[$__range]))', "needs-capacity")], 6,
         description="Control intervals in which both phases were pressured: moving workers "
         "between roles cannot help; the autoscaler fallback (or you) must add capacity.",
         defaults={"thresholds": THRESHOLDS_ANY}, options={**LAST, "colorMode": "background"}),
    stat("Switch in progress",
         [(f"max(fluidpd_controller_switch_in_progress{{{CSEL}}})", "switching")], 6),
    stat("Workers not Active (drain/switch)",
         [(f'sum(fluidpd_worker_role{{{SEL}, state!="active"}}) or vector(0)', "not active")], 6),
    ts("Decisions per control interval outcome",
       [(increase_by("decision", "fluidpd_controller_decisions_total", CSEL, "$window"),
         "{{decision}}")]),
    ts("Controller events",
       [(increase_by("kind", "fluidpd_controller_events_total", CSEL, "$window"), "{{kind}}")]),
    "Switches",
    ts("Completed switches per direction (sidecars)",
       [(increase_by("source, target", "fluidpd_role_switches_total", SEL, "$window"),
         "{{source}} -> {{target}}")]),
    ts("Drain + switch time, dashboard range",
       [(f"histogram_quantile({q}, sum by (le) "
         f"(increase(fluidpd_drain_seconds_bucket{{{SEL}}}[$__range])))",
         f"p{round(q * 100)} (sidecars)") for q in (0.5, 0.95)]
       + [("histogram_quantile(0.95, sum by (le) "
           f"(increase(fluidpd_controller_switch_seconds_bucket{{{CSEL}}}[$__range])))",
           "p95 (controller)")],
       unit="s"),
    "Pool pressure and workers",
    ts("Pool pressure the policy acted on (PPI-bar eq. 20, DPI-bar eqs. 21-22)",
       [(f"max by (signal) (fluidpd_controller_pool_pressure{{{CSEL}}})", "{{signal}}")]),
    ts("Workers answering the controller, by role",
       [(f"sum by (role) (fluidpd_controller_workers{{{CSEL}}})", "{{role}}")],
       defaults={"decimals": 0}),
]  # fmt: skip


def _board(table: list[str | Panel]) -> Board:
    b = Board()
    for item in table:
        if isinstance(item, str):
            b.row(item)
            continue
        extra: dict[str, Any] = {}
        if item.defaults is not None:
            extra["defaults"] = item.defaults
        if item.options is not None:
            extra["options"] = item.options
        b.panel(item.kind, item.title, item.targets, w=item.w, h=item.h, unit=item.unit,
                description=item.description, **extra)  # fmt: skip
    return b


def slo_dashboard() -> dict[str, Any]:
    return _dashboard(
        "fluidpd-slo",
        "FluidPD / SLO",
        "Per FluidPDDeployment: SLO attainment, latency percentiles, the P:D split with role "
        "switches, PPI/DPI, queues, KV and FluidToken.",
        _board(SLO_PANELS),
        worker=True,
    )


def controller_dashboard() -> dict[str, Any]:
    return _dashboard(
        "fluidpd-controller",
        "FluidPD / Controller",
        "The FluidRole controller: decisions, switches and their drain times, pool pressure, "
        "and NEEDS_CAPACITY (both phases pressured).",
        _board(CONTROLLER_PANELS),
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
