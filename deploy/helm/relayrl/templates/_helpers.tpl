{{/* Chart name, truncated to the 63 characters a DNS label allows. */}}
{{- define "relayrl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; components append "-<component>", so leave room for it. */}}
{{- define "relayrl.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "relayrl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of one component's objects: relayrl.componentName (dict "root" $ "component" "queue"). */}}
{{- define "relayrl.componentName" -}}
{{- printf "%s-%s" (include "relayrl.fullname" .root) .component }}
{{- end }}

{{/*
Selector labels never change between upgrades (selectors are immutable), so they carry only
the name, the instance and the component — never the chart or app version.
*/}}
{{- define "relayrl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "relayrl.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "relayrl.labels" -}}
helm.sh/chart: {{ include "relayrl.chart" .root }}
{{ include "relayrl.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: relayrl
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "relayrl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "relayrl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "relayrl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret and key holding the API token. */}}
{{- define "relayrl.authSecretName" -}}
{{- default (printf "%s-auth" (include "relayrl.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* The Secret and key holding the Redis password (in-release Redis or external). */}}
{{- define "relayrl.redisSecretName" -}}
{{- if .Values.redis.enabled }}
{{- default (printf "%s-redis" (include "relayrl.fullname" .)) .Values.redis.auth.existingSecret }}
{{- else }}
{{- default (printf "%s-redis" (include "relayrl.fullname" .)) .Values.externalRedis.existingSecret }}
{{- end }}
{{- end }}

{{- define "relayrl.redisSecretKey" -}}
{{- if .Values.redis.enabled }}{{ .Values.redis.auth.existingSecretKey }}{{ else }}{{ .Values.externalRedis.existingSecretKey }}{{ end }}
{{- end }}

{{/* True (non-empty) when the chart must create the Redis password Secret itself. */}}
{{- define "relayrl.createRedisSecret" -}}
{{- if .Values.redis.enabled }}{{ if not .Values.redis.auth.existingSecret }}true{{ end }}
{{- else }}{{ if and (not .Values.externalRedis.existingSecret) .Values.externalRedis.password }}true{{ end }}
{{- end }}
{{- end }}

{{/* True when Redis needs a password at all (an external Redis may run without one). */}}
{{- define "relayrl.redisHasPassword" -}}
{{- if or .Values.redis.enabled .Values.externalRedis.existingSecret .Values.externalRedis.password }}true{{ end }}
{{- end }}

{{/* redis://host:port/db without the password; the password is spliced in from the Secret at run time. */}}
{{- define "relayrl.redisHostPort" -}}
{{- if .Values.redis.enabled }}
{{- printf "%s-redis:%d/0" (include "relayrl.fullname" .) (int .Values.redis.port) }}
{{- else }}
{{- printf "%s:%d/%d" (required "externalRedis.host is required when redis.enabled is false" .Values.externalRedis.host) (int .Values.externalRedis.port) (int .Values.externalRedis.db) }}
{{- end }}
{{- end }}

{{- define "relayrl.redisScheme" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.tls }}rediss{{ else }}redis{{ end }}
{{- end }}

{{/* Secrets reach containers only as env vars from Secrets, never through a ConfigMap. */}}
{{- define "relayrl.secretEnv" -}}
- name: RELAYRL_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "relayrl.authSecretName" . }}
      key: {{ .Values.auth.existingSecretKey }}
{{- end }}

{{/* The queue's Redis password (the only service that talks to Redis). */}}
{{- define "relayrl.redisPasswordEnv" -}}
{{- if include "relayrl.redisHasPassword" . }}
- name: RELAYRL_QUEUE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "relayrl.redisSecretName" . }}
      key: {{ include "relayrl.redisSecretKey" . }}
{{- end }}
{{- end }}

{{/* Cluster-internal addresses of the gRPC services, host:port. */}}
{{- define "relayrl.queueAddress" -}}
{{- printf "%s-queue:%d" (include "relayrl.fullname" .) (int .Values.queue.grpcPort) }}
{{- end }}

{{- define "relayrl.paramsyncAddress" -}}
{{- printf "%s-paramsync:%d" (include "relayrl.fullname" .) (int .Values.paramsync.grpcPort) }}
{{- end }}

{{/*
One settings ConfigMap: relayrl.settingsConfigMap (dict "root" $ "component" "queue" "prefix"
"RELAYRL_QUEUE_" "settings" $fields "shared" $sharedFields). `settings` fields get the service's
prefix; `shared` ones (shared_field in the settings class) are read unprefixed by every service.
Lists and maps are passed as JSON, which pydantic-settings parses for complex fields.
*/}}
{{- define "relayrl.settingsConfigMap" -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "relayrl.componentName" . }}-settings
  labels:
    {{- include "relayrl.labels" . | nindent 4 }}
data:
  RELAYRL_RUN_ID: {{ .root.Values.run.id | quote }}
  RELAYRL_MAX_STALENESS: {{ .root.Values.run.maxStaleness | quote }}
  RELAYRL_STALL_WARN_S: {{ .root.Values.run.stallWarnS | quote }}
  {{- range $field, $value := .shared }}
  {{ printf "RELAYRL_%s" (upper $field) }}: {{ include "relayrl.envValue" $value }}
  {{- end }}
  {{- range $field, $value := .settings }}
  {{ printf "%s%s" $.prefix (upper $field) }}: {{ include "relayrl.envValue" $value }}
  {{- end }}
{{- end }}

{{/*
A value as an env var string: strings as they are, lists/maps as JSON, the rest as text. YAML
numbers reach templates as float64, and 4194304 would print as 4.194304e+06, which an int
field refuses; whole numbers are therefore printed as integers.
*/}}
{{- define "relayrl.envValue" -}}
{{- if kindIs "string" . }}{{ . | quote }}
{{- else if or (kindIs "map" .) (kindIs "slice" .) }}{{ toJson . | quote }}
{{- else if and (kindIs "float64" .) (eq . (float64 (int64 .))) }}{{ int64 . | toString | quote }}
{{- else }}{{ toString . | quote }}
{{- end }}
{{- end }}

{{- define "relayrl.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}

{{- define "relayrl.containerSecurityContext" -}}
{{- toYaml .Values.securityContext }}
{{- end }}

{{/* The model volume (pvc, hostPath, or an emptyDir filled by the tiny-model init container). */}}
{{- define "relayrl.modelVolume" -}}
- name: model
{{- if eq .Values.model.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName is required when model.source is pvc" .Values.model.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" }}
  hostPath:
    path: {{ required "model.hostPath.path is required when model.source is hostPath" .Values.model.hostPath.path }}
    type: Directory
{{- else }}
  emptyDir:
    sizeLimit: 256Mi
{{- end }}
{{- end }}

{{- define "relayrl.modelPath" -}}
{{- printf "%s/%s" .Values.model.mountPath .Values.model.subPath }}
{{- end }}

{{/* Writes the tiny model into the model volume when model.source is tiny; nothing otherwise. */}}
{{- define "relayrl.tinyModelInitContainer" -}}
{{- if eq .Values.model.source "tiny" }}
- name: tiny-model
  image: {{ include "relayrl.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["relayrl", "model", "init-tiny", {{ include "relayrl.modelPath" . | quote }}]
  securityContext:
    {{- include "relayrl.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    - name: model
      mountPath: {{ .Values.model.mountPath }}
    - name: tmp
      mountPath: /tmp
{{- end }}
{{- end }}

{{- define "relayrl.modelMount" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}

{{/* HTTP probes on the RelayRL services' /healthz and /readyz. */}}
{{- define "relayrl.serviceProbes" -}}
startupProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 5
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 5
  failureThreshold: 3
{{- end }}
