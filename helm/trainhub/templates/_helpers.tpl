{{/* Common labels for trainhub's own objects. */}}
{{- define "trainhub.labels" -}}
app.kubernetes.io/name: trainhub
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Selector labels of one component: include "trainhub.selector" (dict "root" . "component" "jobs") */}}
{{- define "trainhub.selector" -}}
app.kubernetes.io/name: trainhub
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "trainhub.image" -}}
{{ .Values.trainhub.image.repository }}:{{ .Values.trainhub.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Namespace where training Jobs run. */}}
{{- define "trainhub.jobNamespace" -}}
{{ .Values.trainhub.jobs.jobNamespace | default .Release.Namespace }}
{{- end }}

{{/* The settings the hub and the services read from /etc/trainhub/trainhub.json. */}}
{{- define "trainhub.configJson" -}}
{{- $t := .Values.trainhub -}}
{{- dict "profiles" $t.profiles "defaultProfile" $t.defaultProfile "cpuProfile" $t.cpuProfile "quotas" $t.quotas "spawner" $t.spawner "storage" $t.storage "jobs" (omit $t.jobs "resources" "nodeSelector" "tolerations" "persistence") "culler" (omit $t.culler "resources") "kueue" $t.kueue "metrics" $t.metrics "publicUrl" $t.publicUrl "jobNamespace" (include "trainhub.jobNamespace" .) | toPrettyJson }}
{{- end }}

{{/* Environment every trainhub service gets (hub API, its token, the config file). */}}
{{- define "trainhub.serviceEnv" -}}
- name: JUPYTERHUB_API_URL
  value: {{ .root.Values.trainhub.hubApiUrl | quote }}
- name: JUPYTERHUB_API_TOKEN
  valueFrom:
    secretKeyRef:
      name: trainhub-service-tokens
      key: {{ .tokenKey }}
- name: JUPYTERHUB_SERVICE_NAME
  value: {{ .name | quote }}
- name: JUPYTERHUB_SERVICE_PREFIX
  value: {{ printf "/services/%s/" .name | quote }}
- name: JUPYTERHUB_SERVICE_URL
  value: {{ printf "http://0.0.0.0:%d" (int .port) | quote }}
- name: JUPYTERHUB_CLIENT_ID
  value: {{ printf "service-%s" .name | quote }}
- name: JUPYTERHUB_OAUTH_CALLBACK_URL
  value: {{ printf "/services/%s/oauth_callback" .name | quote }}
- name: JUPYTERHUB_BASE_URL
  value: "/"
- name: TRAINHUB_K8S_CONFIG
  value: /etc/trainhub/trainhub.json
- name: TRAINHUB_PUBLIC_URL
  value: {{ .root.Values.trainhub.publicUrl | quote }}
- name: PYTHONUNBUFFERED
  value: "1"
{{- with .root.Values.trainhub.storage.platformCredentialsSecret }}
# the platform's storage credentials (jobs' outputs, values back, job pods' credentials), as the hub gets them
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: AWS_ACCESS_KEY_ID, optional: true}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ . | quote }}, key: AWS_SECRET_ACCESS_KEY, optional: true}
{{- end }}
{{- end }}

{{/* trainhub.extraEnv as container env entries: NAME: value, or NAME: {valueFrom: ...} */}}
{{- define "trainhub.extraEnv" -}}
{{- range $name, $value := .Values.trainhub.extraEnv }}
- name: {{ $name | quote }}
  {{- if kindIs "map" $value }}
  {{- toYaml $value | nindent 2 }}
  {{- else }}
  value: {{ $value | quote }}
  {{- end }}
{{- end }}
{{- end }}
