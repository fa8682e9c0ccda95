{{/*
Names, labels and the image reference, shared by every template.
*/}}

{{/* Chart name, or nameOverride. */}}
{{- define "agent-reach.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-<chart>" (or just the release name when it already contains the chart name), or fullnameOverride. */}}
{{- define "agent-reach.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of the control Deployment, Service, PDB... (fullname is cut to 55 so this fits 63). */}}
{{- define "agent-reach.control.fullname" -}}
{{- printf "%s-control" (include "agent-reach.fullname" .) -}}
{{- end -}}

{{/* Name of the sidecar DaemonSet. */}}
{{- define "agent-reach.sidecar.fullname" -}}
{{- printf "%s-sidecar" (include "agent-reach.fullname" .) -}}
{{- end -}}

{{/* Name of the Secret holding the etcd TLS material (existing or created by the chart). */}}
{{- define "agent-reach.etcdTlsSecretName" -}}
{{- default (printf "%s-etcd-tls" (include "agent-reach.fullname" .)) .Values.etcd.tls.existingSecret -}}
{{- end -}}

{{/* Name of the control pods' ServiceAccount. */}}
{{- define "agent-reach.control.serviceAccountName" -}}
{{- if .Values.control.serviceAccount.create -}}
{{- default (include "agent-reach.control.fullname" .) .Values.control.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.control.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels of every resource. */}}
{{- define "agent-reach.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "agent-reach.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agent-reach
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component; argument: (dict "ctx" $ "component" "control"). */}}
{{- define "agent-reach.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agent-reach.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image reference: repository:tag, or repository@digest. */}}
{{- define "agent-reach.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* URL of this release's control Service, as sidecars dial it. */}}
{{- define "agent-reach.control.url" -}}
{{- printf "http://%s.%s.svc:%d" (include "agent-reach.control.fullname" .) .Release.Namespace (int .Values.control.service.grpcPort) -}}
{{- end -}}

{{/*
The security context of every agent-reach container: non-root (the image's user 65532),
read-only root filesystem, no capabilities, no privilege escalation. Set on the container,
not the pod, so the sidecar keeps it inside pod specs the chart does not own.
*/}}
{{- define "agent-reach.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* An int-or-percent value as text; "" when unset (null or ""). */}}
{{- define "agent-reach.intOrPercent" -}}
{{- if ne (kindOf .) "invalid" -}}{{- toString . -}}{{- end -}}
{{- end -}}

{{/* Checks across values that the schema cannot express; fails rendering with the key named. */}}
{{- define "agent-reach.validate" -}}
{{- if .Values.control.enabled -}}
{{- if and (empty .Values.etcd.endpoints) (empty .Values.etcd.endpointsSecret.name) -}}
{{- fail "etcd.endpoints (or etcd.endpointsSecret.name) is required: the control service keeps its state in an existing etcd cluster" -}}
{{- end -}}
{{- if and (not (empty .Values.etcd.endpoints)) (not (empty .Values.etcd.endpointsSecret.name)) -}}
{{- fail "set only one of etcd.endpoints and etcd.endpointsSecret.name" -}}
{{- end -}}
{{- if and .Values.etcd.tls.enabled (empty .Values.etcd.tls.existingSecret) (or (empty .Values.etcd.tls.ca) (empty .Values.etcd.tls.cert) (empty .Values.etcd.tls.key)) -}}
{{- fail "etcd.tls.enabled needs etcd.tls.existingSecret, or all of etcd.tls.ca, etcd.tls.cert and etcd.tls.key" -}}
{{- end -}}
{{- if and .Values.identity.enabled (eq .Values.control.probes.mode "grpc") -}}
{{- fail "control.probes.mode=grpc needs identity.enabled=false: the kubelet's gRPC probes speak no TLS (use \"http\")" -}}
{{- end -}}
{{- $pdb := .Values.control.podDisruptionBudget -}}
{{- $min := include "agent-reach.intOrPercent" $pdb.minAvailable -}}
{{- $max := include "agent-reach.intOrPercent" $pdb.maxUnavailable -}}
{{- if and $pdb.enabled (eq $min "") (eq $max "") -}}
{{- fail "control.podDisruptionBudget: set minAvailable or maxUnavailable" -}}
{{- end -}}
{{- if and $pdb.enabled (ne $min "") (ne $max "") -}}
{{- fail "control.podDisruptionBudget: set only one of minAvailable and maxUnavailable (the other to \"\")" -}}
{{- end -}}
{{- end -}}
{{- end -}}
