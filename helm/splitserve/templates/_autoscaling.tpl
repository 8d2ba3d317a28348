{{/* Per-pool autoscaling on the pool's own Prometheus signals: an HPA (custom metrics through
an adapter) or, when keda.enabled, a KEDA ScaledObject with prometheus triggers.
Call with (dict "root" $ "role" "prefill"). */}}

{{/* Default PromQL for one signal of one pool. Ratios are averaged, counts are summed (and
divided per replica by KEDA's AverageValue). */}}
{{- define "splitserve.autoscaling.query" -}}
{{- $sel := printf "role=%q,namespace=%q,service=%q" .role .root.Release.Namespace (include "splitserve.componentName" (dict "root" .root "component" .role)) }}
{{- if .metric.query }}
{{- .metric.query }}
{{- else if eq .metric.name "splitserve_kv_usage_ratio" }}
{{- printf "avg(%s{%s})" .metric.name $sel }}
{{- else }}
{{- printf "sum(%s{%s})" .metric.name $sel }}
{{- end }}
{{- end }}

{{- define "splitserve.autoscaling.hpa" -}}
{{- $pool := index .root.Values .role }}
{{- $ctx := dict "root" .root "component" .role }}
{{- $role := .role }}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "splitserve.componentName" $ctx }}
  labels:
    {{- include "splitserve.labels" $ctx | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "splitserve.componentName" $ctx }}
  minReplicas: {{ $pool.autoscaling.minReplicas }}
  maxReplicas: {{ $pool.autoscaling.maxReplicas }}
  metrics:
    {{- range $pool.autoscaling.metrics }}
    - type: Pods
      pods:
        metric:
          name: {{ .name }}
          selector:
            matchLabels:
              role: {{ $role }}
        target:
          type: AverageValue
          averageValue: {{ .target | toString | quote }}
    {{- end }}
  {{- with $pool.autoscaling.behavior }}
  behavior:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{- define "splitserve.autoscaling.scaledObject" -}}
{{- $root := .root }}
{{- $role := .role }}
{{- $pool := index $root.Values .role }}
{{- $ctx := dict "root" $root "component" .role }}
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ include "splitserve.componentName" $ctx }}
  labels:
    {{- include "splitserve.labels" $ctx | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "splitserve.componentName" $ctx }}
  minReplicaCount: {{ $pool.autoscaling.minReplicas }}
  maxReplicaCount: {{ $pool.autoscaling.maxReplicas }}
  pollingInterval: {{ $root.Values.keda.pollingInterval }}
  cooldownPeriod: {{ $root.Values.keda.cooldownPeriod }}
  {{- with $pool.autoscaling.behavior }}
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        {{- toYaml . | nindent 8 }}
  {{- end }}
  triggers:
    {{- range $pool.autoscaling.metrics }}
    - type: prometheus
      metricType: {{ ternary "Value" "AverageValue" (eq .name "splitserve_kv_usage_ratio") }}
      metadata:
        serverAddress: {{ $root.Values.keda.prometheusServerAddress | quote }}
        query: {{ include "splitserve.autoscaling.query" (dict "root" $root "role" $role "metric" .) | quote }}
        threshold: {{ .target | toString | quote }}
    {{- end }}
{{- end }}

{{/* With planner.enabled a pool scales on the planner's decision instead:
desired replicas = ceil(splitserve_planner_desired_replicas{pool} / 1). */}}
{{- define "splitserve.autoscaling.planner" -}}
{{- $root := .root }}
{{- $pool := index $root.Values .role }}
{{- $ctx := dict "root" $root "component" .role }}
{{- $query := printf "max(splitserve_planner_desired_replicas{pool=%q,namespace=%q})" .role $root.Release.Namespace }}
{{- if $root.Values.keda.enabled }}
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ include "splitserve.componentName" $ctx }}
  labels:
    {{- include "splitserve.labels" $ctx | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "splitserve.componentName" $ctx }}
  minReplicaCount: {{ $pool.autoscaling.minReplicas }}
  maxReplicaCount: {{ $pool.autoscaling.maxReplicas }}
  pollingInterval: {{ $root.Values.keda.pollingInterval }}
  cooldownPeriod: {{ $root.Values.keda.cooldownPeriod }}
  triggers:
    - type: prometheus
      metricType: AverageValue
      metadata:
        serverAddress: {{ $root.Values.keda.prometheusServerAddress | quote }}
        query: {{ $query | quote }}
        threshold: "1"
{{- else }}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "splitserve.componentName" $ctx }}
  labels:
    {{- include "splitserve.labels" $ctx | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "splitserve.componentName" $ctx }}
  minReplicas: {{ $pool.autoscaling.minReplicas }}
  maxReplicas: {{ $pool.autoscaling.maxReplicas }}
  metrics:
    - type: External
      external:
        metric:
          name: splitserve_planner_desired_replicas
          selector:
            matchLabels:
              pool: {{ .role }}
        target:
          type: AverageValue
          averageValue: "1"
{{- end }}
{{- end }}

{{/* Whether a pool's replicas belong to an autoscaler (its own signals or the planner's). */}}
{{- define "splitserve.autoscaled" -}}
{{- if or (index .root.Values .role).autoscaling.enabled .root.Values.planner.enabled }}true{{ end }}
{{- end }}

{{- define "splitserve.autoscaling" -}}
{{- $pool := index .root.Values .role }}
{{- if .root.Values.planner.enabled }}
{{- include "splitserve.autoscaling.planner" . }}
{{- else if $pool.autoscaling.enabled }}
{{- if .root.Values.keda.enabled }}
{{- include "splitserve.autoscaling.scaledObject" . }}
{{- else }}
{{- include "splitserve.autoscaling.hpa" . }}
{{- end }}
{{- end }}
{{- end }}
