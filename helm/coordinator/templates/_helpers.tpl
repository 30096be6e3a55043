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

{{/* An image reference from {repository, tag, digest}: repository:tag, repository@digest or
     repository:tag@digest. A digest pins the exact image (a tag can be moved under a running
     release); called with (list VALUES-PATH IMAGE HINT). */}}
{{- define "coordinator.imageRef" -}}
{{- $path := index . 0 -}}{{- $image := index . 1 -}}{{- $hint := index . 2 -}}
{{- $repository := required (printf "%s.repository is required: %s" $path $hint) $image.repository -}}
{{- $digest := $image.digest | default "" -}}
{{- if and $digest (not (regexMatch "^sha256:[0-9a-f]{64}$" $digest)) -}}
{{- fail (printf "%s.digest must be sha256: and 64 hex digits, got %q" $path $digest) -}}
{{- end -}}
{{- if not (or $image.tag $digest) -}}
{{- fail (printf "%s.tag (or %s.digest) is required: the tag of that image, e.g. --set %s.tag=0.1.0, or its digest, e.g. --set %s.digest=sha256:... (no default: nothing is published under a name the chart could assume)" $path $path $path $path) -}}
{{- end -}}
{{- $repository -}}{{- with $image.tag -}}:{{ . }}{{- end -}}{{- with $digest -}}@{{ . }}{{- end -}}
{{- end -}}

{{/* The coordinator image: repository and a tag or digest are required (no published default). */}}
{{- define "coordinator.image" -}}
{{- include "coordinator.imageRef" (list "image" .Values.image "the registry path of the coordinator image you built and pushed (docs/deploy.md, The image), e.g. --set image.repository=registry.example/coordinator") -}}
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
{{- $_ := include "coordinator.image" . -}}
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
{{- if eq .Values.auth.mode "tokens" -}}
{{- $tokens := .Values.auth.tokenSecret -}}
{{- if and $tokens.name $tokens.tokenFile -}}
{{- fail "auth.tokenSecret: give either name (an existing Secret) or tokenFile (the chart creates the Secret), not both" -}}
{{- end -}}
{{- if not (or $tokens.name $tokens.tokenFile) -}}
{{- fail "auth.tokenSecret: auth.mode=tokens needs the token file: name an existing Secret that holds it (auth.tokenSecret.name), or give the file to create one (--set-file auth.tokenSecret.tokenFile=tokens.json, written by coordinator token new)" -}}
{{- end -}}
{{- if and $tokens.tokenFile (hasKey (fromJson $tokens.tokenFile) "Error") -}}
{{- fail "auth.tokenSecret.tokenFile is not a JSON object: give the file coordinator token new writes" -}}
{{- end -}}
{{- end -}}
{{- $pool := .Values.workerPool -}}
{{- if $pool.enabled -}}
{{- /* 10: the worker's GIVE_BACK_TIMEOUT (coordinator/sdk/_pool.py), how long it gives back
       what is still running after the grace before it exits. */ -}}
{{- $giveBack := 10 -}}
{{- $needed := add (int $pool.shutdownGraceSeconds) $giveBack -}}
{{- if le (int $pool.terminationGracePeriodSeconds) $needed -}}
{{- fail (printf "workerPool.terminationGracePeriodSeconds (%d) must exceed workerPool.shutdownGraceSeconds + %d s (%d): after its grace the worker takes up to %d s to give back the claims still running, and the kubelet would kill it mid-way (those tasks would wait out their leases)" (int $pool.terminationGracePeriodSeconds) $giveBack $needed $giveBack) -}}
{{- end -}}
{{- if not .Values.service.headless -}}
{{- fail "workerPool needs service.headless: the pool dials dns:///<fullname>-headless to spread over the replicas" -}}
{{- end -}}
{{- if and (eq .Values.auth.mode "tokens") (not $pool.tokenSecret.name) -}}
{{- fail "workerPool.tokenSecret.name: name the Secret that holds the pool's bearer token (COORDINATOR_TOKEN)" -}}
{{- end -}}
{{- if and $pool.autoscaling.keda.enabled $pool.autoscaling.hpa.enabled -}}
{{- fail "workerPool.autoscaling: enable keda or hpa, not both (each would own the replica count)" -}}
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

{{/* The worker pool: its name, labels and the image it runs (required when enabled). */}}
{{- define "coordinator.workerPool.fullname" -}}
{{- printf "%s-%s" (include "coordinator.fullname" .) .Values.workerPool.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "coordinator.workerPool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coordinator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker-pool
{{- end -}}

{{- define "coordinator.workerPool.image" -}}
{{- include "coordinator.imageRef" (list "workerPool.image" .Values.workerPool.image "your worker image (with the coordinator SDK installed)") -}}
{{- end -}}

{{- define "coordinator.etcd.image" -}}
{{- include "coordinator.imageRef" (list "etcd.bundled.image" .Values.etcd.bundled.image "the etcd image") -}}
{{- end -}}

{{/* The gRPC target of the pool: every replica through the headless Service. */}}
{{- define "coordinator.workerPool.target" -}}
{{- printf "dns:///%s-headless.%s.svc.%s:%d" (include "coordinator.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.service.grpcPort) -}}
{{- end -}}

{{/* PromQL label matchers that pick this release's series (as a ServiceMonitor labels them). */}}
{{- define "coordinator.promSelector" -}}
{{- default (printf "namespace=%q,service=%q" .Release.Namespace (include "coordinator.fullname" .)) .Values.metrics.prometheusRule.selector -}}
{{- end -}}

{{/* Whether the alerts are rendered: as set, or (null) whenever the ServiceMonitor is. */}}
{{- define "coordinator.prometheusRule.enabled" -}}
{{- $on := .Values.metrics.prometheusRule.enabled -}}
{{- if kindIs "invalid" $on -}}{{- $on = .Values.metrics.serviceMonitor.enabled -}}{{- end -}}
{{- if $on -}}true{{- end -}}
{{- end -}}

{{/* The pool's scaling figure: ready plus claimed tasks of its queue (max over replicas: each
     replica exports the same values). */}}
{{- define "coordinator.workerPool.query" -}}
{{- $match := printf "%s,queue=%q" (include "coordinator.promSelector" .) .Values.workerPool.queue -}}
{{- printf "(max(coordinator_queue_ready_tasks{%s}) or vector(0)) + (max(coordinator_queue_claimed_tasks{%s}) or vector(0))" $match $match -}}
{{- end -}}

{{/* The archive's PVC: the one named in values, else the one the chart creates. */}}
{{- define "coordinator.archiveClaimName" -}}
{{- .Values.config.archivePersistentVolumeClaim | default (printf "%s-archive" (include "coordinator.fullname" .)) -}}
{{- end -}}

{{/* The console's pod labels (its Deployment, Service and NetworkPolicy select on them). */}}
{{- define "coordinator.console.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coordinator.name" . }}-console
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: console
{{- end -}}

{{/* The `from` of an ingress rule: the NetworkPolicyPeers given, or (none given) every pod of
     the release's namespace. Never a rule without `from`: that admits any source, pods of other
     namespaces and addresses outside the cluster alike. */}}
{{- define "coordinator.networkPolicy.from" -}}
from:
{{- toYaml (. | default (list (dict "podSelector" (dict)))) | nindent 2 }}
{{- end -}}

{{/* Whole seconds of a duration as the server takes it ("7d", "1.5h", "3600": a number with an
     optional s, m, h, d or w; values.schema.json checks the form). */}}
{{- define "coordinator.seconds" -}}
{{- $text := toString . -}}
{{- $unit := regexFind "[smhdw]$" $text -}}
{{- $per := get (dict "" 1 "s" 1 "m" 60 "h" 3600 "d" 86400 "w" 604800) $unit -}}
{{- mulf (float64 (trimSuffix $unit $text)) $per | int64 -}}
{{- end -}}
