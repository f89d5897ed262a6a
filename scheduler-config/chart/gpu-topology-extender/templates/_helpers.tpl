{{/*
Contracts written once. Object names are fixed (one release per cluster): kube-scheduler's urlPrefix, the policies'
ServiceAccount names and the certificates' names all follow from them.
*/}}

{{/* Helm's labels, added to every object's own (which win: the agents' app.kubernetes.io/instance selects). */}}
{{- define "gte.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* The labels of one component's objects and Pods: (dict "ctx" . "name" NAME "component" COMPONENT). */}}
{{- define "gte.componentLabels" -}}
app.kubernetes.io/name: {{ .name }}
{{- with .instance }}
app.kubernetes.io/instance: {{ . }}
{{- end }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: gpu-topology
{{- end }}

{{/* An image reference: (dict "ctx" . "image" .Values.x.image); the tag defaults to the chart's appVersion. */}}
{{- define "gte.image" -}}
{{ .image.repository }}:{{ .image.tag | default .ctx.Chart.AppVersion }}
{{- end }}

{{/* The Service kube-scheduler calls, and the name in the extender's certificate. */}}
{{- define "gte.extender.host" -}}
gpu-topology-extender.{{ .Release.Namespace }}.svc
{{- end }}

{{- define "gte.extender.url" -}}
https://{{ include "gte.extender.host" . }}:443
{{- end }}

{{/* Secret names, by TLS mode. */}}
{{- define "gte.tls.extenderSecret" -}}
{{ if eq .Values.tls.mode "existingSecrets" }}{{ .Values.tls.existingSecrets.extender }}{{ else }}gpu-topology-extender-tls{{ end }}
{{- end }}

{{- define "gte.tls.schedulerSecret" -}}
{{ if eq .Values.tls.mode "existingSecrets" }}{{ .Values.tls.existingSecrets.scheduler }}{{ else }}gpu-topology-scheduler-client-tls{{ end }}
{{- end }}

{{- define "gte.seal.secret" -}}
{{ .Values.seal.existingSecret | default "gpu-topology-seal" }}
{{- end }}

{{/* The profile's defaults under what the values set. */}}
{{- define "gte.topologyLevels" -}}
{{- $levels := .Values.extender.topologyLevels -}}
{{- if and (not $levels) (eq .Values.profile "gb200") -}}
{{- $levels = list "network.topology.nvidia.com/spine" "network.topology.nvidia.com/leaf" -}}
{{- end -}}
{{ join "," $levels }}
{{- end }}

{{- define "gte.scheduler.featureGates" -}}
{{- $gates := dict -}}
{{- if eq .Values.profile "gb200" }}{{ $_ := set $gates "SchedulerPopFromBackoffQ" false }}{{ end -}}
{{- $gates = merge (deepCopy .Values.scheduler.featureGates) $gates -}}
{{- range $i, $name := keys $gates | sortAlpha }}{{ if $i }},{{ end }}{{ $name }}={{ index $gates $name }}{{ end }}
{{- end }}

{{/*
Placement of a Deployment's Pods: (dict "values" .Values.x "spread" NAME): the priority class, node selector, node
affinity and tolerations the values give; with "spread", never two Pods labelled app.kubernetes.io/name=NAME on
one node (one node lost or drained takes at most one replica).
*/}}
{{- define "gte.placement" -}}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if or .values.nodeAffinity .spread }}
affinity:
  {{- with .values.nodeAffinity }}
  nodeAffinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .spread }}
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            app.kubernetes.io/name: {{ . }}
  {{- end }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The objects of one of scheduler-config/'s manifests (files/ links to it), so that the chart and `kubectl apply -k`
install the same policies, RBAC and alerts from one text: (dict "ctx" . "file" "files/x.yaml" "skip" (list NAME)).
The two namespaces are replaced by the release's and the agent's (in metadata, subjects and the policies' CEL
alike), Helm's labels added, and the documents and binding subjects named in "skip" left out.
*/}}
{{- define "gte.manifest" -}}
{{- $ctx := .ctx -}}
{{- $text := $ctx.Files.Get .file | replace "gpu-topology-system" $ctx.Release.Namespace | replace "gpu-topology-node" $ctx.Values.agent.namespace -}}
{{- $labels := include "gte.labels" $ctx | fromYaml -}}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" $text -1 }}
{{- $object := fromYaml $doc }}
{{- if and $object.kind (not (has $object.metadata.name ($.skip | default list))) }}
{{- $_ := set $object.metadata "labels" (merge ($object.metadata.labels | default dict) $labels) }}
{{- if $object.subjects }}
{{- $kept := list }}
{{- range $object.subjects }}{{ if not (has .name ($.skip | default list)) }}{{ $kept = append $kept . }}{{ end }}{{ end }}
{{- $_ := set $object "subjects" $kept }}
{{- end }}
---
{{ toYaml $object }}
{{- end }}
{{- end }}
{{- end }}
