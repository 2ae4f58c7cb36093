{{/*
Helpers, all prefixed "gemma4-serving." (template names are global across a chart and its
subcharts). Selector labels are built only from fixed labels (name + instance): user labels
(commonLabels, podLabels) never enter a selector, so they can change without breaking upgrades.
*/}}

{{- define "gemma4-serving.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gemma4-serving.fullname" -}}
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

{{/* A name derived from the full name: (dict "ctx" $ "suffix" "x") -> <fullname, cut>-x, <= 63 chars. */}}
{{- define "gemma4-serving.suffixedName" -}}
{{- $suffix := printf "-%s" .suffix }}
{{- printf "%s%s" (include "gemma4-serving.fullname" .ctx | trunc (int (sub 63 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{- define "gemma4-serving.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gemma4-serving.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gemma4-serving.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of the serving pods' selector: the fixed labels plus the fixed component. */}}
{{- define "gemma4-serving.serverSelectorLabels" -}}
{{ include "gemma4-serving.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{- define "gemma4-serving.loadtestSelectorLabels" -}}
{{ include "gemma4-serving.selectorLabels" . }}
app.kubernetes.io/component: loadtest
{{- end }}

{{- define "gemma4-serving.labels" -}}
helm.sh/chart: {{ include "gemma4-serving.chart" . }}
{{ include "gemma4-serving.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gemma4-serving
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gemma4-serving.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gemma4-serving.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* image reference: (dict "image" .Values.image "ctx" $) */}}
{{- define "gemma4-serving.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/* imagePullSecrets as LocalObjectReferences: each item a plain name or the Kubernetes form
{name: regcred}. For every pod spec of the chart. */}}
{{- define "gemma4-serving.imagePullSecrets" -}}
{{- range .Values.imagePullSecrets }}
- name: {{ if kindIs "map" . }}{{ .name }}{{ else }}{{ . }}{{ end }}
{{- end }}
{{- end }}

{{/* "true" when the cluster serves the Prometheus Operator API (or when forced). */}}
{{- define "gemma4-serving.hasPrometheusOperator" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/* Effective metrics mode: serviceMonitor | annotations | none. */}}
{{- define "gemma4-serving.metricsMode" -}}
{{- $mode := .Values.metrics.mode }}
{{- if eq $mode "auto" }}
{{- if include "gemma4-serving.hasPrometheusOperator" . }}serviceMonitor{{ else }}annotations{{ end }}
{{- else }}
{{- $mode }}
{{- end }}
{{- end }}

{{/* Rule files: every dashboards/rules/*.yaml whose top level has `groups:` (promtool test
files next to them have `rule_files:`/`tests:` instead and are skipped). Returns a YAML list of
{path, groups}. */}}
{{- define "gemma4-serving.ruleFiles" -}}
{{- $out := list }}
{{- range $path, $_ := .Files.Glob "files/dashboards/rules/*.yaml" }}
{{- $doc := $.Files.Get $path | fromYaml }}
{{- if and (kindIs "map" $doc) (hasKey $doc "groups") }}
{{- $out = append $out (dict "path" $path "groups" $doc.groups) }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* The target matchers in every selector of the rule files: dashboards/generate.py's
CONFIG["vllm_target_selector"], verbatim (charts/tests/test_rules_and_schema.py checks that the
rendered rules keep none of it). */}}
{{- define "gemma4-serving.ruleTargetSelector" -}}
job=~".*(vllm|gemma4).*|kubernetes-service-endpoints"
{{- end }}

{{/* The matchers of the alerts' reads of recorded series (gemma4:*): generate.py's
CONFIG["recorded_selector"], verbatim (the same test checks it). */}}
{{- define "gemma4-serving.ruleRecordedSelector" -}}
namespace=~".*", service=~".*"
{{- end }}

{{- define "gemma4-serving.prometheusRuleEnabled" -}}
{{- $v := .Values.metrics.prometheusRule.enabled }}
{{- if eq (toString $v) "auto" }}
{{- if include "gemma4-serving.hasPrometheusOperator" . }}true{{ end }}
{{- else if eq (toString $v) "true" }}true
{{- end }}
{{- end }}

{{/* The Service URL the load test targets. */}}
{{- define "gemma4-serving.serviceURL" -}}
{{- printf "http://%s.%s.svc:%d" (include "gemma4-serving.fullname" .) .Release.Namespace (int .Values.service.port) }}
{{- end }}

{{/* Seconds the startup probe allows a first start (download, load, compile, warm-up):
initialDelaySeconds + periodSeconds x failureThreshold. */}}
{{- define "gemma4-serving.startupBudgetSeconds" -}}
{{- $p := .Values.probes.startup }}
{{- add (int $p.initialDelaySeconds) (mul (int $p.periodSeconds) (int $p.failureThreshold)) }}
{{- end }}

{{/* The Deployment's progressDeadlineSeconds: the value, or the startup budget plus 600 s for
scheduling, image pull, init containers and the first readiness probes (Kubernetes' default of
600 s would mark a normal first start as failed long before the startup probe gives up). */}}
{{- define "gemma4-serving.progressDeadlineSeconds" -}}
{{- $budget := int (include "gemma4-serving.startupBudgetSeconds" .) }}
{{- if kindIs "invalid" .Values.progressDeadlineSeconds }}
{{- add $budget 600 }}
{{- else if lt (int .Values.progressDeadlineSeconds) $budget }}
{{- fail (printf "progressDeadlineSeconds (%d) is shorter than the startup probe's budget (%d s = probes.startup initialDelaySeconds + periodSeconds x failureThreshold): every slow first start would be reported as a failed rollout; raise it or leave it null" (int .Values.progressDeadlineSeconds) $budget) }}
{{- else }}
{{- int .Values.progressDeadlineSeconds }}
{{- end }}
{{- end }}

{{/* "true" when the chart creates a model-cache claim that only one node can attach
(ReadWriteOnce / ReadWriteOncePod without ReadWriteMany) and the pods are not declared to share
a node (modelCache.podsOnOneNode; never enough for ReadWriteOncePod). */}}
{{- define "gemma4-serving.modelCacheSingleAttach" -}}
{{- $c := .Values.modelCache }}
{{- if and $c.enabled (not $c.existingClaim) (not (has "ReadWriteMany" $c.accessModes)) }}
{{- if or (has "ReadWriteOncePod" $c.accessModes) (not $c.podsOnOneNode) }}true{{ end }}
{{- end }}
{{- end }}

{{/* The Deployment strategy: the value when set; otherwise Recreate where a surge pod could not
attach the model cache, RollingUpdate (one pod at a time, never below the replica count) else. */}}
{{- define "gemma4-serving.strategy" -}}
{{- if .Values.strategy }}
{{- toYaml .Values.strategy }}
{{- else if include "gemma4-serving.modelCacheSingleAttach" . }}
type: Recreate
{{- else }}
type: RollingUpdate
rollingUpdate:
  maxSurge: 1
  maxUnavailable: 0
{{- end }}
{{- end }}

{{/* The warm-up's done file: on the /tmp emptyDir (the entrypoint removes a stale one at start). */}}
{{- define "gemma4-serving.warmupDoneFile" -}}
/tmp/gemma4-warmup-done
{{- end -}}
