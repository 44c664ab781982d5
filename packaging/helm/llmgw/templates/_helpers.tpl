{{/* The chart's name, and the release's full name (63 characters at most). */}}
{{- define "llmgw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "llmgw.fullname" -}}
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

{{- define "llmgw.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "llmgw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "llmgw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmgw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "llmgw.controlPlaneSelector" -}}
{{ include "llmgw.selectorLabels" . }}
app.kubernetes.io/component: control-plane
{{- end }}

{{- define "llmgw.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The agents' port: a NodePort's own number, since agents dial the advertised one. */}}
{{- define "llmgw.agentPort" -}}
{{- if eq .Values.agentService.type "NodePort" }}
{{- required "agentService.nodePort: with agentService.type NodePort, name the node port (30000-32767) the agents connect to" .Values.agentService.nodePort }}
{{- else }}
{{- .Values.controlPlane.agentPort }}
{{- end }}
{{- end }}

{{/* The Secret with ca.crt, ca.key, cluster.key and admin.token, or "". */}}
{{- define "llmgw.keysSecret" -}}
{{- if and (eq .Values.store.backend "postgres") (not .Values.secrets.existingSecret) }}
{{- fail "store.backend postgres keeps no volume: name secrets.existingSecret, a Secret holding ca.crt, ca.key, cluster.key and admin.token (docs/kubernetes.md shows how to make it)" }}
{{- end }}
{{- .Values.secrets.existingSecret }}
{{- end }}

{{/* server.yaml: the values' settings under the chart's own (docs/configuration.md). */}}
{{- define "llmgw.serverYaml" -}}
{{- $full := include "llmgw.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $advertise := concat .Values.controlPlane.advertise (list (printf "%s-agents.%s.svc" $full $ns) (printf "%s.%s.svc" $full $ns)) }}
{{- $store := dict "backend" .Values.store.backend }}
{{- if eq .Values.store.backend "sqlite" }}
{{- $_ := set $store "dsn" "store.db" }}
{{- else if eq .Values.store.backend "postgres" }}
{{- $_ := required "store.dsn.existingSecret: with store.backend postgres, name the Secret holding the DSN" .Values.store.dsn.existingSecret }}
{{- $_ := set $store "dsn_file" "/etc/llmgw/store/dsn" }}
{{- else }}
{{- fail (printf "store.backend: %q is not sqlite or postgres" .Values.store.backend) }}
{{- end }}
{{- $own := dict
  "listen" (printf "0.0.0.0:%v" .Values.controlPlane.httpPort)
  "agent_port" (int (include "llmgw.agentPort" .))
  "advertise" $advertise
  "ha" (dict "name" (default $full .Values.controlPlane.name) "peer_port" (int .Values.controlPlane.peerPort))
  "store" $store }}
{{- $config := mustMergeOverwrite (deepCopy .Values.controlPlane.config) $own }}
{{- toYaml $config }}
{{- end }}

{{/* The control plane's mounts: the init step's and the server's are the same. */}}
{{- define "llmgw.controlPlaneMounts" -}}
- name: data
  mountPath: /var/lib/llmgw
- name: config
  mountPath: /etc/llmgw/config
  readOnly: true
{{- if .Values.secrets.existingSecret }}
- name: keys
  mountPath: /etc/llmgw/keys
  readOnly: true
{{- end }}
{{- if eq .Values.store.backend "postgres" }}
- name: store-dsn
  mountPath: /etc/llmgw/store
  readOnly: true
{{- end }}
{{- end }}
