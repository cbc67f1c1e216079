{{/* Chart name. */}}
{{- define "gpu-ledger.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name when it already contains the chart name. */}}
{{- define "gpu-ledger.fullname" -}}
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

{{- define "gpu-ledger.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-ledger.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-ledger.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpu-ledger.labels" -}}
helm.sh/chart: {{ include "gpu-ledger.chart" . }}
{{ include "gpu-ledger.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-ledger
{{- end }}

{{- define "gpu-ledger.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-ledger.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Culling mode, normalised: a bare YAML `off` arrives as boolean false.
*/}}
{{- define "gpu-ledger.cullMode" -}}
{{- $m := .Values.culling.mode | toString | lower }}
{{- if eq $m "false" }}{{ $m = "off" }}{{ end }}
{{- if eq $m "true" }}{{ $m = "on" }}{{ end }}
{{- if not (has $m (list "off" "dry-run" "on")) }}
{{- fail (printf "culling.mode must be one of \"off\", \"dry-run\", \"on\" (got %q)" (.Values.culling.mode | toString)) }}
{{- end }}
{{- $m }}
{{- end }}

{{- define "gpu-ledger.cullingEnabled" -}}
{{- if ne (include "gpu-ledger.cullMode" .) "off" }}true{{ end }}
{{- end }}

{{- define "gpu-ledger.totalShards" -}}
{{- $n := int .Values.sharding.totalShards }}
{{- if lt $n 1 }}{{ fail "sharding.totalShards must be >= 1" }}{{ end }}
{{- $n }}
{{- end }}

{{- define "gpu-ledger.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "gpu-ledger.tokenPath" -}}
{{- if .Values.prometheus.bearerToken.secretName -}}
/etc/gpu-ledger/prometheus-token/{{ .Values.prometheus.bearerToken.secretKey }}
{{- else if .Values.prometheus.bearerToken.useServiceAccountToken -}}
/var/run/secrets/kubernetes.io/serviceaccount/token
{{- end }}
{{- end }}

{{/*
Container args. Keep in step with deploy/kustomize/base/deployment.yaml (tests/deploy_chart.rs
compares them for the default values).
*/}}
{{- define "gpu-ledger.args" -}}
{{- $mode := include "gpu-ledger.cullMode" . -}}
- serve
- --listen=0.0.0.0:{{ .Values.port }}
- --prometheus-url={{ required "prometheus.url is required" .Values.prometheus.url }}
{{- with (include "gpu-ledger.tokenPath" .) }}
- --prometheus-bearer-token-file={{ . }}
{{- if hasPrefix "http://" (lower $.Values.prometheus.url) }}
{{- if $.Values.prometheus.allowInsecureToken }}
- --prometheus-allow-insecure-token
{{- else }}
{{- fail "prometheus.url is http:// but a bearer token is configured: the token would be sent unencrypted. Use an https:// URL, or set prometheus.allowInsecureToken=true to accept that" }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.prometheus.ca.configMapName }}
- --prometheus-ca-file=/etc/gpu-ledger/prometheus-ca/{{ .Values.prometheus.ca.configMapKey }}
{{- end }}
{{- if .Values.prometheus.insecureSkipVerify }}
- --prometheus-insecure-skip-verify
{{- end }}
- --label-scheme={{ .Values.prometheus.labelScheme }}
{{- with .Values.prometheus.selector }}
- {{ printf "--prometheus-selector=%s" . | toJson }}
{{- end }}
{{- range .Values.prometheus.headers }}
- {{ printf "--prometheus-header=%s" . | toJson }}
{{- end }}
- --window={{ .Values.ledger.window }}
- --refresh-interval={{ .Values.ledger.refreshInterval }}
- --scrape-interval={{ .Values.ledger.scrapeInterval }}
- --idle-threshold={{ .Values.ledger.idleThreshold }}
- --stuck-after={{ .Values.ledger.stuckAfter }}
{{- with .Values.ledger.namespaces }}
- --namespaces={{ join "," . }}
{{- end }}
{{- with (include "gpu-ledger.exporterNamespaces" . | fromJsonArray) }}
- --exporter-namespaces={{ join "," . }}
{{- end }}
{{- /* Only when not the binary's default, so the default rendering matches deploy/kustomize. */}}
{{- with .Values.ledger.kueueConfigMap }}
{{- if not .name }}
- --kueue-config-map=
{{- else if ne (printf "%s/%s" .namespace .name) "kueue-system/kueue-manager-config" }}
- --kueue-config-map={{ .namespace }}/{{ .name }}
{{- end }}
{{- end }}
- --log-format={{ .Values.logFormat }}
- --cull={{ $mode }}
{{- if ne $mode "off" }}
- --cull-idle-after={{ .Values.culling.idleAfter }}
- --cull-min-runtime={{ .Values.culling.minRuntime }}
- --cull-max-per-cycle={{ .Values.culling.maxPerCycle }}
{{- with .Values.culling.namespaces }}
- --cull-namespaces={{ join "," . }}
{{- end }}
{{- with .Values.culling.excludeNamespaces }}
- --cull-exclude-namespaces={{ join "," . }}
{{- end }}
{{- with .Values.culling.excludeNamespaceSelector }}
- --cull-namespace-selector={{ . }}
{{- end }}
{{- with .Values.culling.killSwitch }}
{{- if contains "/" . }}
{{- fail (printf "culling.killSwitch must be a ConfigMap name in the release namespace, not %q (the chart grants get on that name there)" .) }}
{{- end }}
- --cull-kill-switch={{ . }}
{{- end }}
{{- if gt (int (include "gpu-ledger.totalShards" .)) 1 }}
- --lease-name={{ .Values.culling.leaseName }}-$(POD_INDEX)
{{- else }}
- --lease-name={{ .Values.culling.leaseName }}
{{- end }}
{{- if not (has (toString .Values.culling.notice) (list "" "0" "0s")) }}
- --cull-notice={{ .Values.culling.notice }}
{{- end }}
{{- if not (has (toString .Values.culling.maxSnooze) (list "" "0" "0s")) }}
- --cull-max-snooze={{ .Values.culling.maxSnooze }}
{{- end }}
- --cull-targets={{ join "," .Values.culling.targets }}
{{- if not .Values.culling.respectActivity }}
- --cull-respect-activity=false
{{- end }}
{{- if .Values.culling.noticeWebhook.secretName }}
- --cull-notice-webhook-url-file=/etc/gpu-ledger/notice-webhook/{{ .Values.culling.noticeWebhook.secretKey }}
- --cull-notice-webhook-format={{ .Values.culling.noticeWebhook.format }}
{{- end }}
{{- end }}
{{- if gt (int (include "gpu-ledger.totalShards" .)) 1 }}
- --shard=$(POD_INDEX)
- --total-shards={{ include "gpu-ledger.totalShards" . }}
{{- end }}
{{- if .Values.tls.secretName }}
- --tls-cert-file=/etc/gpu-ledger/tls/tls.crt
- --tls-key-file=/etc/gpu-ledger/tls/tls.key
{{- end }}
{{- if .Values.apiAuth.tokenSecretName }}
- --api-token-file=/etc/gpu-ledger/api-token/{{ .Values.apiAuth.tokenSecretKey }}
{{- end }}
{{- if .Values.apiAuth.kubernetes }}
- --api-auth=kubernetes
{{- end }}
{{- with .Values.extraArgs }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod template shared by the Deployment and the sharded StatefulSet. */}}
{{- define "gpu-ledger.podTemplate" -}}
metadata:
  labels:
    {{- include "gpu-ledger.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if or .Values.podAnnotations .Values.scrapeAnnotations.enabled }}
  annotations:
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- if .Values.scrapeAnnotations.enabled }}
    # Plain Prometheus' kubernetes_sd pod discovery (the community chart's kubernetes-pods job).
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ .Values.port | quote }}
    prometheus.io/path: /metrics
    {{- if .Values.tls.secretName }}
    prometheus.io/scheme: https
    {{- end }}
    {{- end }}
  {{- end }}
spec:
  serviceAccountName: {{ include "gpu-ledger.serviceAccountName" . }}
  automountServiceAccountToken: true
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  containers:
    - name: gpu-ledger
      image: {{ include "gpu-ledger.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        {{- include "gpu-ledger.args" . | nindent 8 }}
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- if gt (int (include "gpu-ledger.totalShards" .)) 1 }}
        - name: POD_INDEX
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: http
          containerPort: {{ .Values.port }}
          protocol: TCP
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
          {{- if .Values.tls.secretName }}
          scheme: HTTPS
          {{- end }}
        {{- toYaml .Values.probes.readiness | nindent 8 }}
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
          {{- if .Values.tls.secretName }}
          scheme: HTTPS
          {{- end }}
        {{- toYaml .Values.probes.liveness | nindent 8 }}
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if .Values.prometheus.bearerToken.secretName }}
        - name: prometheus-token
          mountPath: /etc/gpu-ledger/prometheus-token
          readOnly: true
        {{- end }}
        {{- if .Values.prometheus.ca.configMapName }}
        - name: prometheus-ca
          mountPath: /etc/gpu-ledger/prometheus-ca
          readOnly: true
        {{- end }}
        {{- if .Values.tls.secretName }}
        - name: tls
          mountPath: /etc/gpu-ledger/tls
          readOnly: true
        {{- end }}
        {{- if .Values.apiAuth.tokenSecretName }}
        - name: api-token
          mountPath: /etc/gpu-ledger/api-token
          readOnly: true
        {{- end }}
        {{- if and (ne (include "gpu-ledger.cullMode" .) "off") .Values.culling.noticeWebhook.secretName }}
        - name: notice-webhook
          mountPath: /etc/gpu-ledger/notice-webhook
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 16Mi
    {{- if .Values.prometheus.bearerToken.secretName }}
    - name: prometheus-token
      secret:
        secretName: {{ .Values.prometheus.bearerToken.secretName }}
        items:
          - key: {{ .Values.prometheus.bearerToken.secretKey }}
            path: {{ .Values.prometheus.bearerToken.secretKey }}
    {{- end }}
    {{- if .Values.prometheus.ca.configMapName }}
    - name: prometheus-ca
      configMap:
        name: {{ .Values.prometheus.ca.configMapName }}
        items:
          - key: {{ .Values.prometheus.ca.configMapKey }}
            path: {{ .Values.prometheus.ca.configMapKey }}
    {{- end }}
    {{- if .Values.tls.secretName }}
    # Mounted as a directory (no subPath): Secret updates reach the files, and gpu-ledger
    # reloads them.
    - name: tls
      secret:
        secretName: {{ .Values.tls.secretName }}
        items:
          - key: tls.crt
            path: tls.crt
          - key: tls.key
            path: tls.key
    {{- end }}
    {{- if .Values.apiAuth.tokenSecretName }}
    - name: api-token
      secret:
        secretName: {{ .Values.apiAuth.tokenSecretName }}
        items:
          - key: {{ .Values.apiAuth.tokenSecretKey }}
            path: {{ .Values.apiAuth.tokenSecretKey }}
    {{- end }}
    {{- if and (ne (include "gpu-ledger.cullMode" .) "off") .Values.culling.noticeWebhook.secretName }}
    # A directory mount (no subPath): a rotated Secret reaches the file, read at every post.
    - name: notice-webhook
      secret:
        secretName: {{ .Values.culling.noticeWebhook.secretName }}
        items:
          - key: {{ .Values.culling.noticeWebhook.secretKey }}
            path: {{ .Values.culling.noticeWebhook.secretKey }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
Spec of the Notebook ValidatingAdmissionPolicy for the user in .user. Keep in step with
deploy/kustomize/overlays/culling/admission-policy.yaml (tests/deploy_chart.rs compares them).
*/}}
{{- define "gpu-ledger.notebookPolicySpec" -}}
failurePolicy: Fail
matchConstraints:
  resourceRules:
    - apiGroups: ["kubeflow.org"]
      apiVersions: ["*"]
      operations: ["CREATE", "UPDATE", "DELETE"]
      resources: ["notebooks", "notebooks/*"]
matchConditions:
  - name: only-gpu-ledger
    expression: request.userInfo.username == {{ .user | quote }}
variables:
  - name: owned
    expression: >-
      ['kubeflow-resource-stopped', 'gpu-ledger.io/stopped-at', 'gpu-ledger.io/stopped-by',
      'gpu-ledger.io/stop-reason', 'gpu-ledger.io/stop-scheduled-at',
      'gpu-ledger.io/stop-notice-reason']
  - name: isUpdate
    expression: >-
      request.operation == 'UPDATE' && (!has(request.subResource) || request.subResource == '')
  - name: oldAnnotations
    expression: >-
      variables.isUpdate && has(oldObject.metadata.annotations) ?
      oldObject.metadata.annotations : {}
  - name: newAnnotations
    expression: >-
      variables.isUpdate && has(object.metadata.annotations) ?
      object.metadata.annotations : {}
validations:
  - expression: variables.isUpdate
    message: gpu-ledger may only update a Notebook (no create, delete or subresource write).
  - expression: >-
      !variables.isUpdate ||
      (has(object.spec) == has(oldObject.spec) && (!has(object.spec) || object.spec == oldObject.spec)) &&
      (has(object.status) == has(oldObject.status) && (!has(object.status) || object.status == oldObject.status))
    message: gpu-ledger may not change a Notebook's spec or status.
  - expression: >-
      !variables.isUpdate ||
      (has(object.metadata.labels) ? object.metadata.labels : {}) ==
      (has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}) &&
      (has(object.metadata.finalizers) ? object.metadata.finalizers : []) ==
      (has(oldObject.metadata.finalizers) ? oldObject.metadata.finalizers : []) &&
      (has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []) ==
      (has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : [])
    message: gpu-ledger may not change a Notebook's labels, finalizers or owner references.
  - expression: >-
      variables.newAnnotations.all(k, k in variables.owned ||
      (k in variables.oldAnnotations && variables.oldAnnotations[k] == variables.newAnnotations[k])) &&
      variables.oldAnnotations.all(k, k in variables.owned || k in variables.newAnnotations)
    message: >-
      gpu-ledger may only write the annotations kubeflow-resource-stopped,
      gpu-ledger.io/stopped-at, gpu-ledger.io/stopped-by, gpu-ledger.io/stop-reason and
      the notice annotations gpu-ledger.io/stop-scheduled-at and gpu-ledger.io/stop-notice-reason.
  - expression: >-
      !('kubeflow-resource-stopped' in variables.oldAnnotations) ||
      ('kubeflow-resource-stopped' in variables.newAnnotations &&
      variables.newAnnotations['kubeflow-resource-stopped'] == variables.oldAnnotations['kubeflow-resource-stopped'])
    message: gpu-ledger may add kubeflow-resource-stopped, never remove or change it.
{{- end }}

{{/*
Namespaces of dcgm-exporter's DaemonSet pods, as a JSON array: ledger.exporterNamespaces, else
[gpu-operator] when ledger.namespaces restricts the watches, else [] (all namespaces).
*/}}
{{- define "gpu-ledger.exporterNamespaces" -}}
{{- if .Values.ledger.exporterNamespaces -}}
{{- toJson .Values.ledger.exporterNamespaces -}}
{{- else if .Values.ledger.namespaces -}}
["gpu-operator"]
{{- else -}}
[]
{{- end -}}
{{- end }}

{{/* "true" when the ServiceMonitor is rendered: enabled true, or auto where the CRD is served. */}}
{{- define "gpu-ledger.serviceMonitorOn" -}}
{{- $enabled := .Values.serviceMonitor.enabled | toString }}
{{- if or (eq $enabled "true") (and (eq $enabled "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) -}}
true
{{- end }}
{{- end }}

{{/* kube-prometheus-stack's selector label (serviceMonitorSelector, ruleSelector). */}}
{{- define "gpu-ledger.prometheusReleaseLabel" -}}
{{- with .Values.prometheusRelease }}
release: {{ . | quote }}
{{- end }}
{{- end }}
