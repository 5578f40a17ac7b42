{{/* Names, labels, images and the env blocks every workload shares. */}}

{{- define "cascade.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* <release> when it contains the chart's name, else <release>-<name>; short enough that
     "<fullname>-rollout-controller" and a CronJob's Job names stay within DNS limits. */}}
{{- define "cascade.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "cascade.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 30 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* selector labels of one component: include "cascade.selector" (list . "gateway") */}}
{{- define "cascade.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "cascade.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "cascade.labels" -}}
{{ include "cascade.selector" . }}
{{- $root := index . 0 }}
app.kubernetes.io/part-of: cascade
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* an image reference: include "cascade.image" (list . .Values.image.gateway) */}}
{{- define "cascade.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $ref := printf "%s/%s" $root.Values.image.registry $image.repository -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $ref $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref (default $root.Chart.AppVersion $root.Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "cascade.secret" -}}
{{- required "secrets.existingSecret: name the Secret with the keys listed in values.yaml (docs/deployment.md)" .Values.secrets.existingSecret -}}
{{- end -}}

{{/* Redis by role (services/settings.py RedisSettings): CASCADE_REDIS__URL is the cache and,
     without CASCADE_REDIS__DURABLE_URL, the durable store too (the small case). */}}
{{- define "cascade.redisEnv" -}}
{{- include "cascade.redisEnvLines" . | trim -}}
{{- end -}}

{{- define "cascade.redisEnvLines" -}}
{{- $secret := include "cascade.secret" . -}}
{{- $ext := .Values.redis.external -}}
{{- if and .Values.redis.inChart.enabled (not $ext.durableUrlKey) }}
- name: REDIS_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: {{ .Values.secrets.keys.redisPassword }}}}
{{- $durable := printf "redis://:$(REDIS_PASSWORD)@%s-redis:6379/0" (include "cascade.fullname" .) }}
{{- if $ext.cacheUrlKey }}
- {name: CASCADE_REDIS__DURABLE_URL, value: {{ $durable | quote }}}
{{- else }}
- {name: CASCADE_REDIS__URL, value: {{ $durable | quote }}}
{{- end }}
{{- else if $ext.durableUrlKey }}
- name: {{ ternary "CASCADE_REDIS__DURABLE_URL" "CASCADE_REDIS__URL" (ne $ext.cacheUrlKey "") }}
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: {{ $ext.durableUrlKey }}}}
{{- else }}
{{- fail "redis: enable redis.inChart or set redis.external.durableUrlKey" }}
{{- end }}
{{- if $ext.cacheUrlKey }}
- name: CASCADE_REDIS__URL
  valueFrom: {secretKeyRef: {name: {{ $secret }}, key: {{ $ext.cacheUrlKey }}}}
{{- end }}
- {name: CASCADE_REDIS__NAMESPACE, value: {{ .Values.redis.namespace | quote }}}
{{- end -}}

{{- define "cascade.artifactsClaim" -}}
{{- default (printf "%s-artifacts" (include "cascade.fullname" .)) .Values.artifacts.existingClaim -}}
{{- end -}}

{{- define "cascade.heartbeatProbes" -}}
startupProbe:
  exec: {command: ["sh", "-c", "test -f /tmp/heartbeat"]}
  periodSeconds: 5
  failureThreshold: 60
readinessProbe:
  exec: {command: ["sh", "-c", "test -f /tmp/heartbeat"]}
  periodSeconds: 30
livenessProbe:
  exec: {command: ["sh", "-c", "test -n \"$(find /tmp/heartbeat -mmin -{{ . }})\""]}
  periodSeconds: 60
{{- end -}}

{{- /* The export target matching the Triton image: `cascade train`/`retrain` option. */ -}}
{{- define "cascade.tritonTarget" -}}
--triton-target={{ if .Values.triton.gpu.enabled }}{{ .Values.triton.gpu.exportTarget }}{{ else }}cpu{{ end }}
{{- end -}}

{{- define "cascade.scheduling" -}}
{{- $root := index . 0 -}}
{{- $own := index . 1 -}}
{{- $selector := merge (dict) ($own.nodeSelector | default dict) $root.Values.nodeSelector -}}
{{- with $selector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $tolerations := concat ($own.tolerations | default list) $root.Values.tolerations -}}
{{- with $tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}
