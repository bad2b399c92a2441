{{/* The chart name. */}}
{{- define "fluidpd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name: release-based prefix of every resource. */}}
{{- define "fluidpd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fluidpd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of everything the chart creates. */}}
{{- define "fluidpd.labels" -}}
helm.sh/chart: {{ include "fluidpd.chart" . }}
{{ include "fluidpd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fluidpd
{{- end }}

{{/* The operator pods' selector. (app.kubernetes.io/instance is the release here; on the
objects the operator creates it is the FluidPDDeployment's name.) */}}
{{- define "fluidpd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fluidpd.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "fluidpd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fluidpd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* image reference: (dict "image" .Values.image.x "root" .) */}}
{{- define "fluidpd.image" -}}
{{- if eq .image.tag "latest" }}
{{- fail (printf "image %s: the tag 'latest' is not allowed; pin a version (empty = the chart's appVersion)" .image.repository) }}
{{- end }}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* "true" when the operator watches the whole cluster (cluster RBAC, no namespace list). */}}
{{- define "fluidpd.clusterWide" -}}
{{- if and (eq .Values.rbac.scope "cluster") (empty .Values.watchNamespaces) }}true{{ end }}
{{- end }}

{{/* The namespaces the operator watches, as a JSON list (empty: the whole cluster). */}}
{{- define "fluidpd.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- .Values.watchNamespaces | uniq | toJson }}
{{- else if eq .Values.rbac.scope "namespace" }}
{{- list .Release.Namespace | toJson }}
{{- else }}
{{- list | toJson }}
{{- end }}
{{- end }}

{{/* The operator's rules on namespaced resources (shared by the ClusterRole and the Roles). */}}
{{- define "fluidpd.namespacedRules" -}}
- apiGroups: [fluidpd.io]
  resources: [fluidpddeployments, fluidpddeployments/status, fluidpddeployments/scale]
  verbs: [get, list, watch, patch, update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
# get: the token a FluidPDDeployment references; create: the generated <name>-auth secret when
# it references none (never list: the operator reads only the secrets it is pointed at).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
# get: the profile ConfigMap a FluidPDDeployment references (model.profileConfigMap), which its
# switch rule forecasts with, as the workers do.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
{{- end }}
