{{/*
The release of sluice: the images' tag and the version label.
*/}}
{{- define "sluice.version" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{/*
The recommended labels of one object: name and component are the object's
own (dict "root" . "name" … "component" …); the rest are the install's.
Selectors use sluice.selector alone, never these: a Deployment's selector
can not change, and the version changes with every release.
*/}}
{{- define "sluice.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ include "sluice.version" .root | quote }}
app.kubernetes.io/part-of: sluice
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The selector of a workload's pods: its name label, as the manifests have it
since the first release.
*/}}
{{- define "sluice.selector" -}}
app.kubernetes.io/name: {{ . }}
{{- end -}}

{{/*
An image reference: (dict "root" . "image" .Values.<component>.image), each
field defaulting to .Values.image.
*/}}
{{- define "sluice.image" -}}
{{- $registry := .image.registry | default .root.Values.image.registry -}}
{{- $tag := .image.tag | default (include "sluice.version" .root) -}}
{{- if $registry -}}
{{ $registry }}/{{ .image.repository }}:{{ $tag }}
{{- else -}}
{{ .image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/*
A container's image and pull policy lines.
*/}}
{{- define "sluice.containerImage" -}}
image: {{ include "sluice.image" . }}
{{- with (.image.pullPolicy | default .root.Values.image.pullPolicy) }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/*
The pod and container security contexts every sluice pod has (the
namespace enforces the restricted Pod Security Standard).
*/}}
{{- define "sluice.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "sluice.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{/*
The database URL, for the controller and the configurator.
*/}}
{{- define "sluice.databaseEnv" -}}
- name: {{ .envName }}
  valueFrom:
    secretKeyRef:
      name: {{ .root.Values.limits.postgres.secretName }}
      key: {{ .root.Values.limits.postgres.secretKey }}
{{- end -}}

{{/*
The Prometheus that may scrape an admin port.
*/}}
{{- define "sluice.prometheusPeer" -}}
- from:
    - namespaceSelector:
        {{- toYaml .Values.networkPolicies.prometheus.namespaceSelector | nindent 8 }}
      podSelector:
        {{- toYaml .Values.networkPolicies.prometheus.podSelector | nindent 8 }}
{{- end -}}

{{/*
Postgres egress on 5432 for the controller and the configurator.
*/}}
{{- define "sluice.postgresEgress" -}}
- ports:
    - protocol: TCP
      port: 5432
  {{- with .Values.networkPolicies.postgresTo }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/*
Checks of values that the schema can not express; a failed check stops the
render with the reason.
*/}}
{{- define "sluice.validate" -}}
{{- if eq (int .Values.injector.sidecarPorts.proxy) (int .Values.injector.sidecarPorts.admin) -}}
{{- fail (printf "injector.sidecarPorts: proxy and admin are both %v; the sidecar needs two ports" .Values.injector.sidecarPorts.proxy) -}}
{{- end -}}
{{- if and (eq .Values.limits.source "file") (not .Values.limits.file.configMapName) -}}
{{- fail "limits.file.configMapName: required with limits.source=file (a ConfigMap holding the limits file)" -}}
{{- end -}}
{{- if and .Values.tls.mtls (not .Values.tls.trustDomain) -}}
{{- fail "tls.trustDomain: required with tls.mtls" -}}
{{- end -}}
{{- if and (eq .Values.sidecar.callerIdentity "mtls") (not .Values.tls.mtls) -}}
{{- fail "sidecar.callerIdentity: mtls needs tls.mtls (sidecar certificates)" -}}
{{- end -}}
{{- end -}}
