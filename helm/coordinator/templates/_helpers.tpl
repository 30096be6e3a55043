{{/* Names, labels and the values every template shares. */}}

{{- define "coordinator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "coordinator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object, without app.kubernetes.io/component (each object adds its own). */}}
{{- define "coordinator.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/name: {{ include "coordinator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "coordinator.labels" -}}
{{ include "coordinator.commonLabels" . }}
app.kubernetes.io/component: coordinator
{{- end -}}

{{- define "coordinator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coordinator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
{{- end -}}

{{- define "coordinator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "coordinator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "coordinator.tokenSecretName" -}}
{{- default (printf "%s-tokens" (include "coordinator.fullname" .)) .Values.auth.tokenSecret.name -}}
{{- end -}}

{{/* Bundled etcd: the StatefulSet, its headless Service, and the members' stable DNS names. */}}
{{- define "coordinator.etcd.fullname" -}}
{{- printf "%s-etcd" (include "coordinator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "coordinator.etcd.headless" -}}
{{- printf "%s-headless" (include "coordinator.etcd.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "coordinator.etcd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coordinator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: etcd
{{- end -}}

{{/* "<pod>.<headless>.<namespace>.svc.<domain>" of bundled member i. */}}
{{- define "coordinator.etcd.memberHost" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%d.%s.%s.svc.%s" (include "coordinator.etcd.fullname" $root) (index . 1) (include "coordinator.etcd.headless" $root) $root.Release.Namespace $root.Values.clusterDomain -}}
{{- end -}}

{{/* The etcd client endpoints the coordinator dials (host:port each), comma-free list. */}}
{{- define "coordinator.etcdEndpoints" -}}
{{- if eq .Values.etcd.mode "bundled" -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) }}
- {{ include "coordinator.etcd.memberHost" (list $ $i) }}:2379
{{- end -}}
{{- else -}}
{{- if not .Values.etcd.external.endpoints -}}
{{- fail "etcd.external.endpoints: give at least one host:port (or set etcd.mode=bundled)" -}}
{{- end -}}
{{- range .Values.etcd.external.endpoints }}
- {{ . }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The port the kubelet probes: the plaintext health port when TLS is on. */}}
{{- define "coordinator.probePort" -}}
{{- if .Values.auth.tls.enabled -}}health{{- else -}}grpc{{- end -}}
{{- end -}}

{{/* Refuse combinations the schema cannot express. */}}
{{- define "coordinator.validate" -}}
{{- $drain := add (int .Values.preStopSleepSeconds) (int .Values.config.shutdownGrace) -}}
{{- if le (int .Values.terminationGracePeriodSeconds) $drain -}}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed preStopSleepSeconds + config.shutdownGrace (%d): the kubelet would kill calls still draining" (int .Values.terminationGracePeriodSeconds) $drain) -}}
{{- end -}}
{{- if and .Values.auth.tls.enabled (not .Values.auth.tls.secretName) -}}
{{- fail "auth.tls.secretName: name the kubernetes.io/tls Secret to serve TLS with" -}}
{{- end -}}
{{- if and .Values.auth.tls.clientCA (not .Values.auth.tls.enabled) -}}
{{- fail "auth.tls.clientCA needs auth.tls.enabled" -}}
{{- end -}}
{{- if and .Values.auth.tls.clientCA (ne .Values.auth.mode "tokens") -}}
{{- fail "auth.tls.clientCA needs auth.mode=tokens (certificate principals get their roles from the token file)" -}}
{{- end -}}
{{- if and (eq .Values.etcd.mode "external") .Values.etcd.external.tls.enabled (not .Values.etcd.external.tls.secretName) -}}
{{- fail "etcd.external.tls.secretName: name the Secret with etcd's CA (and client certificate)" -}}
{{- end -}}
{{- if and (eq .Values.etcd.mode "external") .Values.etcd.external.auth.enabled (not .Values.etcd.external.auth.secretName) -}}
{{- fail "etcd.external.auth.secretName: name the Secret with etcd's user name and password" -}}
{{- end -}}
{{- end -}}
