{{/* The labels that select one role's pods: the same as the kustomize base's. */}}
{{- define "tessera.selector" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/component: {{ . }}
{{- end }}

{{/* An object's labels: its selector labels and who manages it. Takes (list $ "role"). */}}
{{- define "tessera.labels" -}}
{{ include "tessera.selector" (index . 1) }}
app.kubernetes.io/part-of: tessera
app.kubernetes.io/managed-by: {{ (index . 0).Release.Service }}
helm.sh/chart: {{ printf "%s-%s" (index . 0).Chart.Name (index . 0).Chart.Version }}
{{- end }}

{{- define "tessera.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* The model the roles serve: a built-in's name, or a checkpoint path in the mounted claim. */}}
{{- define "tessera.model" -}}
{{- if .Values.model.checkpointClaim -}}
{{- required "model.checkpointPath is required with model.checkpointClaim" .Values.model.checkpointPath -}}
{{- else -}}
{{ .Values.model.name }}
{{- end -}}
{{- end }}

{{- define "tessera.indexUrl" -}}
{{ .Values.index.url | default "redis://tessera-valkey:6379/0" }}
{{- end }}
