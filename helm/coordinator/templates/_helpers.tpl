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
{{- if eq .Values.etcd.mode "bundled" -}}
{{- $bundled := .Values.etcd.bundled -}}
{{- if and $bundled.auth.enabled (not $bundled.tls.enabled) -}}
{{- fail "etcd.bundled.auth.enabled needs etcd.bundled.tls.enabled: the passwords would cross the network in clear" -}}
{{- end -}}
{{- if and $bundled.tls.enabled (eq $bundled.tls.source "secret") (not (and $bundled.tls.existingSecrets.server $bundled.tls.existingSecrets.client)) -}}
{{- fail "etcd.bundled.tls.existingSecrets: with source=secret name both the server and the client Secret (ca.crt, tls.crt, tls.key each)" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.metrics.tls (not .Values.auth.tls.enabled) -}}
{{- fail "metrics.tls serves the gRPC certificate: it needs auth.tls.enabled" -}}
{{- end -}}
{{- end -}}

{{/* Bundled etcd security: the Secrets that hold its certificates and passwords. */}}
{{- define "coordinator.etcd.serverTlsSecret" -}}
{{- $tls := .Values.etcd.bundled.tls -}}
{{- if eq $tls.source "secret" -}}{{ $tls.existingSecrets.server }}{{- else -}}{{ include "coordinator.etcd.fullname" . }}-server-tls{{- end -}}
{{- end -}}

{{- define "coordinator.etcd.clientTlsSecret" -}}
{{- $tls := .Values.etcd.bundled.tls -}}
{{- if eq $tls.source "secret" -}}{{ $tls.existingSecrets.client }}{{- else -}}{{ include "coordinator.etcd.fullname" . }}-client-tls{{- end -}}
{{- end -}}

{{- define "coordinator.etcd.authSecret" -}}
{{- default (printf "%s-auth" (include "coordinator.etcd.fullname" .)) .Values.etcd.bundled.auth.existingSecret -}}
{{- end -}}

{{- define "coordinator.etcd.scheme" -}}
{{- if .Values.etcd.bundled.tls.enabled -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/* Names in the bundled members' certificate: every member, by wildcard too, and loopback. */}}
{{- define "coordinator.etcd.dnsNames" -}}
{{- $headless := include "coordinator.etcd.headless" . -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) }}
- {{ include "coordinator.etcd.memberHost" (list $ $i) }}
{{- end }}
- "*.{{ $headless }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}"
- "*.{{ $headless }}.{{ .Release.Namespace }}.svc"
- "*.{{ $headless }}"
- localhost
{{- end -}}

{{/* The CN of the client certificate: deliberately no etcd user (etcd would log a
     password-less client in as the user its CN names). */}}
{{- define "coordinator.etcd.clientCN" -}}
{{ include "coordinator.etcd.fullname" . }}-client
{{- end -}}

{{/* How the coordinator (and its etcd jobs) reach etcd securely, whatever the mode:
     tls: {secretName, caKey, certKey, keyKey, clientCert} or empty; auth: {secretName, userKey,
     passwordKey} or empty. */}}
{{- define "coordinator.etcdClientTls" -}}
{{- if eq .Values.etcd.mode "bundled" -}}
{{- if .Values.etcd.bundled.tls.enabled -}}
secretName: {{ include "coordinator.etcd.clientTlsSecret" . }}
caKey: ca.crt
certKey: tls.crt
keyKey: tls.key
clientCert: true
{{- end -}}
{{- else if .Values.etcd.external.tls.enabled -}}
{{- with .Values.etcd.external.tls }}
secretName: {{ .secretName }}
caKey: {{ .caKey }}
certKey: {{ .certKey }}
keyKey: {{ .keyKey }}
clientCert: {{ .clientCert }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "coordinator.etcdClientAuth" -}}
{{- if eq .Values.etcd.mode "bundled" -}}
{{- if .Values.etcd.bundled.auth.enabled -}}
secretName: {{ include "coordinator.etcd.authSecret" . }}
userKey: username
passwordKey: password
{{- end -}}
{{- else if .Values.etcd.external.auth.enabled -}}
{{- with .Values.etcd.external.auth }}
secretName: {{ .secretName }}
userKey: {{ .userKey }}
passwordKey: {{ .passwordKey }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The metrics listen address: metrics.listenAddress (bracketed if IPv6) and the port. */}}
{{- define "coordinator.metricsListen" -}}
{{- $host := .Values.metrics.listenAddress -}}
{{- if contains ":" $host -}}[{{ $host }}]{{- else -}}{{ $host }}{{- end -}}:{{ .Values.service.metricsPort }}
{{- end -}}
