{{/*
Names. Kubernetes names are DNS labels: at most 63 characters, no trailing dash.
*/}}
{{- define "tensorgate.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<chart>, or the release name alone when it already has the chart's name in it. */}}
{{- define "tensorgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $chart := include "tensorgate.name" . -}}
{{- $full := ternary .Release.Name (printf "%s-%s" .Release.Name $chart) (contains $chart .Release.Name) -}}
{{- $full | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tensorgate.metricsServiceName" -}}
{{- printf "%s-metrics" (include "tensorgate.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels that pick this release's pods: the Deployment's selector and the Services'. */}}
{{- define "tensorgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tensorgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tensorgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tensorgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The container ports: tritonserver's, fixed, so that Triton clients and dashboards work. */}}
{{- define "tensorgate.httpPort" -}}8000{{- end -}}
{{- define "tensorgate.grpcPort" -}}8001{{- end -}}
{{- define "tensorgate.metricsPort" -}}8002{{- end -}}

{{/*
The server's command line after the image's entrypoint, one quoted item per flag. Flags are
tensorgate's (tritonserver's names), so `tensorgate --help` documents each.
*/}}
{{- define "tensorgate.args" -}}
{{- $mode := .Values.server.modelControlMode -}}
{{- if not (has $mode (list "none" "poll" "explicit")) -}}
{{- fail (printf "server.modelControlMode must be none, poll or explicit, not %q" $mode) -}}
{{- end -}}
{{- if and .Values.server.loadModels (ne $mode "explicit") -}}
{{- fail "server.loadModels needs server.modelControlMode=explicit" -}}
{{- end -}}
- {{ printf "--model-repository=%s" .Values.modelRepository.mountPath | quote }}
- {{ printf "--http-port=%s" (include "tensorgate.httpPort" .) | quote }}
- {{ printf "--grpc-port=%s" (include "tensorgate.grpcPort" .) | quote }}
- {{ printf "--metrics-port=%s" (include "tensorgate.metricsPort" .) | quote }}
- {{ printf "--model-control-mode=%s" $mode | quote }}
{{- range .Values.server.loadModels }}
- {{ printf "--load-model=%s" . | quote }}
{{- end }}
{{- if eq $mode "poll" }}
- {{ printf "--repository-poll-secs=%d" (int .Values.server.repositoryPollSecs) | quote }}
{{- end }}
- {{ printf "--strict-readiness=%t" .Values.server.strictReadiness | quote }}
- {{ printf "--exit-on-error=%t" .Values.server.exitOnError | quote }}
- {{ printf "--exit-timeout-secs=%d" (int .Values.server.exitTimeoutSecs) | quote }}
- {{ printf "--frontends=%d" (int .Values.server.frontends) | quote }}
- {{ printf "--metrics-config=histogram_latencies=%t" .Values.metrics.histogramLatencies | quote }}
{{- range .Values.server.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Exactly one autoscaler, or none. */}}
{{- define "tensorgate.autoscaled" -}}
{{- if and .Values.autoscaling.keda.enabled .Values.autoscaling.hpa.enabled -}}
{{- fail "enable at most one of autoscaling.keda and autoscaling.hpa" -}}
{{- end -}}
{{- if or .Values.autoscaling.keda.enabled .Values.autoscaling.hpa.enabled -}}true{{- end -}}
{{- end -}}

{{/* The label matchers of this release's series, as a ServiceMonitor scrape labels them. */}}
{{- define "tensorgate.seriesSelector" -}}
{{- if .Values.autoscaling.seriesSelector -}}
{{- .Values.autoscaling.seriesSelector -}}
{{- else -}}
{{- printf "namespace=%q,service=%q" .Release.Namespace (include "tensorgate.metricsServiceName" .) -}}
{{- end -}}
{{- end -}}

{{/*
Average queue time per request (µs) over the window, for the whole release: the sum of the
queue time counters' rates over the sum of the success counters' rates. clamp_min keeps an idle
release at 0 rather than 0/0, so that it scales down.
*/}}
{{- define "tensorgate.queueTimeQuery" -}}
{{- $sel := include "tensorgate.seriesSelector" . -}}
{{- $w := .Values.autoscaling.window -}}
{{- printf "sum(rate(nv_inference_queue_duration_us{%s}[%s])) / clamp_min(sum(rate(nv_inference_request_success{%s}[%s])), 1e-9)" $sel $w $sel $w -}}
{{- end -}}
