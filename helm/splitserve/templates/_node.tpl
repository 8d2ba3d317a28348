{{/* The prefill and decode pools share one Deployment shape. Call with (dict "root" $ "role" "prefill"). */}}

{{/* Container resources: the pool's resources plus its GPUs (gpus per rank x tensor- x
pipeline-parallel size) and RDMA devices (as limits). */}}
{{- define "splitserve.node.resources" -}}
{{- $pool := index .root.Values .role }}
{{- $res := deepCopy ($pool.resources | default dict) }}
{{- $limits := deepCopy (get $res "limits" | default dict) }}
{{- if gt (int $pool.gpus) 0 }}
{{- $ranks := mul (int ($pool.tensorParallelSize | default 1)) (int ($pool.pipelineParallelSize | default 1)) }}
{{- $_ := set $limits "nvidia.com/gpu" (mul (int $pool.gpus) $ranks) }}
{{- end }}
{{- if $pool.rdma.enabled }}
{{- range $k, $v := $pool.rdma.resources }}
{{- $_ := set $limits $k $v }}
{{- end }}
{{- end }}
{{- if $limits }}
{{- $_ := set $res "limits" $limits }}
{{- end }}
{{- toYaml $res }}
{{- end }}

{{- define "splitserve.node.securityContext" -}}
{{- $pool := index .root.Values .role }}
{{- $sc := deepCopy .root.Values.containerSecurityContext }}
{{- if $pool.rdma.enabled }}
{{- $caps := deepCopy (get $sc "capabilities" | default dict) }}
{{- $_ := set $caps "add" $pool.rdma.capabilities }}
{{- $_ := set $sc "capabilities" $caps }}
{{- end }}
{{- toYaml $sc }}
{{- end }}

{{- define "splitserve.node.deployment" -}}
{{- $root := .root }}
{{- $pool := index $root.Values .role }}
{{- $ctx := dict "root" $root "component" .role }}
{{- $gpu := gt (int $pool.gpus) 0 }}
{{- $range := $root.Values.transfer.portRange }}
{{- if and $range.enabled (lt (int $range.end) (int $range.start)) }}
{{- fail "transfer.portRange.end must be >= transfer.portRange.start" }}
{{- end }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "splitserve.componentName" $ctx }}
  labels:
    {{- include "splitserve.labels" $ctx | nindent 4 }}
spec:
  {{- if not (include "splitserve.autoscaled" (dict "root" $root "role" .role)) }}
  replicas: {{ $pool.replicas }}
  {{- end }}
  {{- with $pool.updateStrategy }}
  strategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "splitserve.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "splitserve.selectorLabels" $ctx | nindent 8 }}
        {{- with $pool.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $pool.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      {{- include "splitserve.podCommon" (dict "root" $root "spec" $pool) | nindent 6 }}
      {{- with $pool.runtimeClassName }}
      runtimeClassName: {{ . }}
      {{- end }}
      {{- if eq $root.Values.model.source "pull" }}
      {{- include "splitserve.pullInitContainer" $root | nindent 6 }}
      {{- end }}
      containers:
        - name: {{ .role }}
          image: {{ include "splitserve.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            - {{ .role }}
            - --host
            - 0.0.0.0
            - --port
            - {{ $pool.httpPort | quote }}
            - --transfer-port
            - {{ $pool.transferPort | quote }}
            - --model
            - {{ $root.Values.model.name | quote }}
            - --device
            - {{ ternary "cuda" "cpu" $gpu }}
            {{- include "splitserve.settingArgs" (dict "root" $root "values" $pool "component" "node") | nindent 12 }}
            {{- $spec := $pool.speculative | default dict }}
            {{- if and (eq .role "decode") (ne ($spec.method | default "none") "none") }}
            - --speculative-method
            - {{ $spec.method | quote }}
            - --num-speculative-tokens
            - {{ $spec.numTokens | default 4 | quote }}
            {{- with $spec.draftModel }}
            - --draft-model
            - {{ . | quote }}
            {{- end }}
            {{- end }}
            {{- with (include "splitserve.lora.nodeArgs" $root) }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- $kv := $pool.kvOffload | default dict }}
            {{- $disk := $kv.disk | default dict }}
            {{- if gt (float64 ($kv.cpuGb | default 0)) 0.0 }}
            - --kv-offload-cpu-gb
            - {{ $kv.cpuGb | quote }}
            {{- if $disk.enabled }}
            - --kv-offload-disk-path
            - {{ $disk.mountPath | quote }}
            - --kv-offload-disk-gb
            - {{ $disk.sizeGb | quote }}
            {{- end }}
            {{- else if $disk.enabled }}
            {{- fail (printf "%s.kvOffload.disk needs %s.kvOffload.cpuGb > 0" .role .role) }}
            {{- end }}
            {{- with $pool.extraArgs }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          env:
            {{- include "splitserve.redis.env" $root | nindent 12 }}
            {{- include "splitserve.clusterToken.env" $root | nindent 12 }}
            {{- /* SIGTERM starts the drain; it ends 10 s before the kubelet's SIGKILL. */}}
            - name: SPLITSERVE_DRAIN_TIMEOUT_S
              value: {{ max 1 (sub (int $pool.terminationGracePeriodSeconds) 10) | quote }}
            - name: SPLITSERVE_NODE_ID
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: SPLITSERVE_ADVERTISE_HOST
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            {{- include "splitserve.commonEnv" $root | nindent 12 }}
            {{- if $range.enabled }}
            - name: UCX_TCP_PORT_RANGE
              value: {{ printf "%d-%d" (int $range.start) (int $range.end) | quote }}
            {{- end }}
            {{- with $root.Values.transfer.ucxTls }}
            - name: UCX_TLS
              value: {{ . | quote }}
            {{- end }}
            {{- with $pool.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: http
              containerPort: {{ $pool.httpPort }}
              protocol: TCP
            - name: transfer
              containerPort: {{ $pool.transferPort }}
              protocol: TCP
          {{- include "splitserve.probes" (dict "port" "http" "probes" $pool.probes) | nindent 10 }}
          securityContext:
            {{- include "splitserve.node.securityContext" . | nindent 12 }}
          resources:
            {{- include "splitserve.node.resources" . | nindent 12 }}
          volumeMounts:
            {{- include "splitserve.commonMounts" $root | nindent 12 }}
            - name: dshm
              mountPath: /dev/shm
            {{- if $disk.enabled }}
            - name: kv-offload
              mountPath: {{ $disk.mountPath }}
            {{- end }}
            {{- $lv := $root.Values.lora.volume | default dict }}
            {{- if $lv.claimName }}
            - name: lora-adapters
              mountPath: {{ $lv.mountPath | default "/adapters" }}
              readOnly: true
            {{- end }}
      volumes:
        {{- include "splitserve.commonVolumes" $root | nindent 8 }}
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $pool.shmSize }}
        {{- if $disk.enabled }}
        - name: kv-offload
          {{- if $disk.claimName }}
          persistentVolumeClaim:
            claimName: {{ $disk.claimName }}
          {{- else }}
          emptyDir:
            {{- /* room for the files plus their headers and a file being renamed */}}
            sizeLimit: {{ printf "%dMi" (add (int (mulf $disk.sizeGb 1024)) 64) }}
          {{- end }}
        {{- end }}
        {{- if $lv.claimName }}
        - name: lora-adapters
          persistentVolumeClaim:
            claimName: {{ $lv.claimName }}
            readOnly: true
        {{- end }}
{{- end }}

{{/* Service in front of a pool: names its ports for the ServiceMonitor; the router finds
nodes through Redis, not through this Service. */}}
{{- define "splitserve.node.service" -}}
{{- $pool := index .root.Values .role }}
{{- $ctx := dict "root" .root "component" .role }}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "splitserve.componentName" $ctx }}
  labels:
    {{- include "splitserve.labels" $ctx | nindent 4 }}
    splitserve.io/metrics: "true"
spec:
  clusterIP: None
  publishNotReadyAddresses: false
  selector:
    {{- include "splitserve.selectorLabels" $ctx | nindent 4 }}
  ports:
    - name: http
      port: {{ $pool.httpPort }}
      targetPort: http
      protocol: TCP
    - name: transfer
      port: {{ $pool.transferPort }}
      targetPort: transfer
      protocol: TCP
{{- end }}
