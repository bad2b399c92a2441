{{/* The SLO recording rules and alerts (the PrometheusRule's spec; tests/monitoring evaluates
every expression against a live stack). Series carry namespace and fluidpd_deployment (the
ServiceMonitor's relabeling); the controller's own series carry fluidpd_namespace. */}}
{{- define "fluidpd.ruleGroups" -}}
{{- $r := .Values.prometheusRule }}
{{- $w := $r.window }}
{{- $by := "namespace, fluidpd_deployment" }}
groups:
  - name: fluidpd.slo.rules
    rules:
      # Share of finished requests within their TTFT target, TPOT target, and both (slo="all"),
      # counted exactly per request by the decode sidecar against the worker's own SLO.
      - record: fluidpd:slo_attainment:ratio_rate{{ $w }}
        expr: |
          sum by ({{ $by }}, slo) (rate(fluidpd_slo_requests_total{outcome="met"}[{{ $w }}]))
          /
          sum by ({{ $by }}, slo) (rate(fluidpd_slo_requests_total[{{ $w }}]))
      - record: fluidpd:ttft_seconds:p95_rate{{ $w }}
        expr: |
          histogram_quantile(0.95, sum by ({{ $by }}, le) (rate(fluidpd_ttft_seconds_bucket[{{ $w }}])))
      - record: fluidpd:tpot_seconds:p95_rate{{ $w }}
        expr: |
          histogram_quantile(0.95, sum by ({{ $by }}, le) (rate(fluidpd_tpot_seconds_bucket[{{ $w }}])))
      - record: fluidpd:workers:count
        expr: |
          sum by ({{ $by }}, role) (fluidpd_worker_role)
      - record: fluidpd:ppi:max
        expr: |
          max by ({{ $by }}) (fluidpd_ppi)
      - record: fluidpd:dpi_load:avg_decode
        expr: |
          avg by ({{ $by }}) (fluidpd_dpi_load * on (namespace, fluidpd_deployment, worker) group_left () (fluidpd_worker_role{role="decode"} == 1))
  - name: fluidpd.slo.alerts
    rules:
      - alert: FluidPDSLOAttainmentLow
        expr: |
          fluidpd:slo_attainment:ratio_rate{{ $w }}{slo="all"} < {{ $r.sloTarget }}
        for: {{ $r.alerts.sloAttainmentFor }}
        labels:
          severity: {{ $r.alerts.severity }}
        annotations:
          summary: SLO attainment of {{ "{{ $labels.namespace }}/{{ $labels.fluidpd_deployment }}" }} is below {{ $r.sloTarget }}
          description: Only {{ "{{ $value | humanizePercentage }}" }} of the requests finished within both their TTFT and TPOT targets over the last {{ $w }}.
      - alert: FluidPDRoleSwitchStuck
        expr: |
          max by ({{ $by }}, worker, state) (fluidpd_worker_role{state!="active"}) > 0
        for: {{ $r.alerts.roleSwitchStuckFor }}
        labels:
          severity: {{ $r.alerts.severity }}
        annotations:
          summary: Worker {{ "{{ $labels.worker }}" }} of {{ "{{ $labels.namespace }}/{{ $labels.fluidpd_deployment }}" }} is stuck in {{ "{{ $labels.state }}" }}
          description: A FluidRole switch started more than {{ $r.alerts.roleSwitchStuckFor }} ago and the worker has not come back Active.
      - alert: FluidPDCapacityExhausted
        expr: |
          sum by (fluidpd_namespace, fluidpd_deployment) (increase(fluidpd_controller_decisions_total{decision="needs-capacity"}[{{ $w }}])) > 0
        for: {{ $r.alerts.capacityExhaustedFor }}
        labels:
          severity: {{ $r.alerts.severity }}
        annotations:
          summary: "{{ "{{ $labels.fluidpd_namespace }}/{{ $labels.fluidpd_deployment }}" }} needs more capacity"
          description: Both the prefill and the decode pool have been pressured for {{ $r.alerts.capacityExhaustedFor }}; moving workers between roles cannot help. Raise maxWorkers or the worker count.
{{- end }}
