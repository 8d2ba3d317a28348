{{/* Names, labels and values shared by every template. */}}

{{- define "splitserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "splitserve.fullname" -}}
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

{{/* Name of one component's resources. Call with (dict "root" $ "component" "router"). */}}
{{- define "splitserve.componentName" -}}
{{- printf "%s-%s" (include "splitserve.fullname" .root | trunc 50 | trimSuffix "-") .component }}
{{- end }}

{{- define "splitserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every resource. Call with (dict "root" $ "component" NAME). */}}
{{- define "splitserve.labels" -}}
helm.sh/chart: {{ include "splitserve.chart" .root }}
{{ include "splitserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: splitserve
{{- end }}

{{/* Labels that select one component's pods. Call with (dict "root" $ "component" NAME). */}}
{{- define "splitserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "splitserve.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels shared by all of this release's pods (no component). */}}
{{- define "splitserve.releaseSelector" -}}
app.kubernetes.io/name: {{ include "splitserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "splitserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "splitserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "splitserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* "true" when an external Redis replaces the bundled one, else empty. */}}
{{- define "splitserve.redis.external" -}}
{{- if or .Values.redis.externalUrl .Values.redis.externalUrlSecret.name }}true{{ end }}
{{- end }}

{{/* SPLITSERVE_REDIS_URL: cluster.settings reads it (no --redis flag: the URL may hold a password). */}}
{{- define "splitserve.redis.env" -}}
- name: SPLITSERVE_REDIS_URL
{{- if .Values.redis.externalUrlSecret.name }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.externalUrlSecret.name }}
      key: {{ .Values.redis.externalUrlSecret.key }}
{{- else if .Values.redis.externalUrl }}
  value: {{ .Values.redis.externalUrl | quote }}
{{- else }}
  value: {{ printf "redis://%s:%d/0" (include "splitserve.componentName" (dict "root" . "component" "redis")) (int .Values.redis.bundled.port) | quote }}
{{- end }}
{{- end }}

{{- define "splitserve.apiKeySecretName" -}}
{{- default (printf "%s-api-key" (include "splitserve.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "splitserve.clusterTokenSecretName" -}}
{{- default (printf "%s-cluster-token" (include "splitserve.fullname" .)) .Values.clusterToken.existingSecret }}
{{- end }}

{{/* The cluster token, for the router and every node (never on a command line). */}}
{{- define "splitserve.clusterToken.env" -}}
- name: SPLITSERVE_CLUSTER_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "splitserve.clusterTokenSecretName" . }}
      key: {{ .Values.clusterToken.secretKey }}
{{- end }}

{{/* Env shared by every splitserve container: model cache and writable caches under /tmp. */}}
{{- define "splitserve.commonEnv" -}}
- name: SPLITSERVE_MODEL_CACHE
  value: {{ .Values.model.mountPath | quote }}
- name: HOME
  value: /tmp
- name: XDG_CACHE_HOME
  value: /tmp/.cache
- name: HF_HOME
  value: /tmp/.cache/huggingface
- name: TRITON_CACHE_DIR
  value: /tmp/.cache/triton
- name: PYTHONUNBUFFERED
  value: "1"
{{- end }}

{{/* Volumes every splitserve pod has: writable /tmp and the model cache. */}}
{{- define "splitserve.commonVolumes" -}}
- name: tmp
  emptyDir: {}
- name: model
{{- if eq .Values.model.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName is required when model.source is pvc" .Values.model.pvc.claimName }}
    readOnly: {{ .Values.model.pvc.readOnly }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end }}

{{- define "splitserve.commonMounts" -}}
- name: tmp
  mountPath: /tmp
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: {{ and (eq .Values.model.source "pvc") .Values.model.pvc.readOnly }}
{{- end }}

{{/* Init container that pulls the model into the emptyDir (model.source: pull). */}}
{{- define "splitserve.pullInitContainer" -}}
initContainers:
  - name: model-pull
    image: {{ include "splitserve.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    args: ["model", "pull", {{ .Values.model.name | quote }}, "--model-cache", {{ .Values.model.mountPath | quote }}]
    env:
      {{- include "splitserve.commonEnv" . | nindent 6 }}
    securityContext:
      {{- toYaml .Values.containerSecurityContext | nindent 6 }}
    {{- with .Values.model.pull.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      {{- include "splitserve.commonMounts" . | nindent 6 }}
{{- end }}

{{/* Pod spec fields shared by every splitserve pod. Call with (dict "root" $ "spec" COMPONENT_VALUES). */}}
{{- define "splitserve.podCommon" -}}
serviceAccountName: {{ include "splitserve.serviceAccountName" .root }}
automountServiceAccountToken: false
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ .spec.terminationGracePeriodSeconds }}
{{- with .spec.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .spec.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .spec.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .spec.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* An HTTP probe. Call with (dict "path" P "port" NAME "timing" VALUES). */}}
{{- define "splitserve.httpProbe" -}}
httpGet:
  path: {{ .path }}
  port: {{ .port }}
periodSeconds: {{ .timing.periodSeconds }}
failureThreshold: {{ .timing.failureThreshold }}
timeoutSeconds: {{ .timing.timeoutSeconds | default 3 }}
{{- end }}

{{/* startup + liveness on /health, readiness on /ready. Call with (dict "port" NAME "probes" VALUES). */}}
{{- define "splitserve.probes" -}}
startupProbe:
  {{- include "splitserve.httpProbe" (dict "path" "/health" "port" .port "timing" .probes.startup) | nindent 2 }}
livenessProbe:
  {{- include "splitserve.httpProbe" (dict "path" "/health" "port" .port "timing" .probes.liveness) | nindent 2 }}
readinessProbe:
  {{- include "splitserve.httpProbe" (dict "path" "/ready" "port" .port "timing" .probes.readiness) | nindent 2 }}
{{- end }}

{{/* PodDisruptionBudget spec budget. Call with the component's pdb values. */}}
{{- define "splitserve.pdbBudget" -}}
{{- if hasKey . "minAvailable" }}
minAvailable: {{ .minAvailable }}
{{- else }}
maxUnavailable: {{ .maxUnavailable }}
{{- end }}
{{- end }}

{{/* LoRA: `--lora-modules name=path ...` for the router and the nodes (lora.modules). */}}
{{- define "splitserve.lora.modules" -}}
{{- if .Values.lora.modules }}
- --lora-modules
{{- range .Values.lora.modules }}
- {{ printf "%s=%s" .name .path | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* LoRA flags of a prefill or decode node (lora.enabled). */}}
{{- define "splitserve.lora.nodeArgs" -}}
{{- $l := .Values.lora }}
{{- if $l.enabled }}
- --enable-lora
- --max-loras
- {{ $l.maxLoras | default 1 | quote }}
- --max-lora-rank
- {{ $l.maxLoraRank | default 16 | quote }}
{{- if gt (int ($l.maxCpuLoras | default 0)) 0 }}
- --max-cpu-loras
- {{ $l.maxCpuLoras | quote }}
{{- end }}
{{- include "splitserve.lora.modules" . }}
{{- else if $l.modules }}
{{- fail "lora.modules needs lora.enabled: true" }}
{{- end }}
{{- end }}

{{/* A component's settings from its values, one flag per key: files/settings.json lists each
component's keys and flags (generated from the settings' declarations by
`python -m launcher.helm_schema --write`). An absent key or an empty string leaves the
setting at the process's default. Call with (dict "root" $ "values" $pool "component" "node"). */}}
{{- define "splitserve.settingArgs" -}}
{{- $flags := index (.root.Files.Get "files/settings.json" | fromJson) .component }}
{{- range $key, $flag := $flags }}
{{- if hasKey $.values $key }}
{{- $v := index $.values $key }}
{{- if kindIs "bool" $v }}
- {{ ternary $flag (printf "--no-%s" (trimPrefix "--" $flag)) $v }}
{{- else if kindIs "slice" $v }}
- {{ $flag }}
{{- range $v }}
- {{ . | quote }}
{{- end }}
{{- else if and (kindIs "float64" $v) (eq $v (float64 (int64 $v))) }}
- {{ $flag }}
- {{ int64 $v | quote }}
{{- else if ne (toString $v) "" }}
- {{ $flag }}
- {{ $v | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
