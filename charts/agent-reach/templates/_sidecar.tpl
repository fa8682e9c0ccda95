{{/*
=====================================================================================
agent-reach.sidecar.container — the agent-reach sidecar container, to put next to an
agent container in a pod spec you own. Renders one list item ("- name: ...").

Argument: a dict with
  ctx      (required) the agent-reach chart's context: `$` inside this chart; in a chart
           that depends on agent-reach, `(index .Subcharts "agent-reach")` (its values,
           chart and release).
  sidecar  (optional) a dict merged over the chart's `sidecar` values for this pod only,
           e.g. (dict "tenant" "team-a"). Unknown keys fail rendering. Zero values ("" / 0
           / false) do not override (a Helm merge rule).
  name     (optional) container name; default "agent-reach-sidecar".
  native   (optional) true renders a native sidecar (restartPolicy: Always) to put under
           initContainers (Kubernetes >= 1.29): it starts, and passes its startup probe,
           before the agent container starts, and stops after it.
  mode     (internal) "pod" (default) or "daemonset" (used by this chart's DaemonSet).

Every setting is rendered as an AGENT_REACH_* environment variable that
agent-reach-sidecar parses (see `agent-reach-sidecar --help`):
  AGENT_REACH_LISTEN         127.0.0.1:<localPort> next to an agent (the agent reaches it
                             on localhost); in DaemonSet mode 0.0.0.0:<localPort> published
                             as a hostPort, or <node IP>:<hostPort> with hostNetwork
  AGENT_REACH_MESH_LISTEN    0.0.0.0:<meshPort>
  AGENT_REACH_ADVERTISE      <pod IP>:<meshPort> (downward API status.podIP)
  AGENT_REACH_CONTROL, _TENANT, _MAX_PAYLOAD_BYTES, _DEFAULT_TIMEOUT, _DEADLINE_RESERVE,
  _HEARTBEAT_INTERVAL, _PROBE_INTERVAL, _CONTROL_TIMEOUT, _WORKER_THREADS, _LOG_FORMAT
                             from the sidecar values
  AGENT_REACH_ADMIN_LISTEN   <pod IP>:<adminPort>: /healthz and /readyz for the probes
  With identity.enabled (the default): AGENT_REACH_TRUST_BUNDLE_FILE,
  AGENT_REACH_JOIN_TOKEN_FILE and AGENT_REACH_TRUST_DOMAIN, read from the Secret
  identity.joinTokenSecret mounted from the pod volume "agent-reach-identity": put
  `include "agent-reach.sidecar.volumes" (dict "ctx" ...)` under the pod's volumes.
  With identity.enabled=false: AGENT_REACH_INSECURE_PLAINTEXT_CONTROL (INSECURE).
Probes: GET /readyz (startup, readiness) and /healthz (liveness) on the admin port (the
mesh port needs client certificates, which the kubelet does not have).
=====================================================================================
*/}}
{{- define "agent-reach.sidecar.container" -}}
{{- $ctx := required "agent-reach.sidecar.container: pass (dict \"ctx\" <agent-reach context> ...)" .ctx -}}
{{- $s := deepCopy $ctx.Values.sidecar -}}
{{- with .sidecar -}}
{{- range $k, $_ := . -}}
{{- if not (hasKey $ctx.Values.sidecar $k) -}}
{{- fail (printf "agent-reach.sidecar.container: unknown sidecar setting %q (see the sidecar section of the agent-reach values.yaml)" $k) -}}
{{- end -}}
{{- end -}}
{{- $s = mergeOverwrite $s (deepCopy .) -}}
{{- end -}}
{{- $mode := default "pod" .mode -}}
{{- $ds := $s.daemonset -}}
{{- $control := $s.control -}}
{{- if empty $control -}}
{{- $control = list (include "agent-reach.control.url" $ctx) -}}
{{- end -}}
- name: {{ default "agent-reach-sidecar" .name }}
  image: {{ include "agent-reach.image" $ctx | quote }}
  imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
  command: ["/usr/local/bin/agent-reach-sidecar"]
  {{- with $s.extraArgs }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .native }}
  restartPolicy: Always
  {{- end }}
  env:
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    {{- if and (eq $mode "daemonset") $ds.hostNetwork }}
    - name: HOST_IP
      valueFrom:
        fieldRef:
          fieldPath: status.hostIP
    - name: AGENT_REACH_LISTEN
      value: {{ printf "$(HOST_IP):%d" (int $ds.hostPort) | quote }}
    {{- else if eq $mode "daemonset" }}
    - name: AGENT_REACH_LISTEN
      value: {{ printf "0.0.0.0:%d" (int $s.localPort) | quote }}
    {{- else }}
    - name: AGENT_REACH_LISTEN
      value: {{ printf "127.0.0.1:%d" (int $s.localPort) | quote }}
    {{- end }}
    - name: AGENT_REACH_MESH_LISTEN
      value: {{ printf "0.0.0.0:%d" (int $s.meshPort) | quote }}
    - name: AGENT_REACH_ADVERTISE
      value: {{ printf "$(POD_IP):%d" (int $s.meshPort) | quote }}
    - name: AGENT_REACH_CONTROL
      value: {{ join "," $control | quote }}
    - name: AGENT_REACH_TENANT
      value: {{ $s.tenant | quote }}
    - name: AGENT_REACH_MAX_PAYLOAD_BYTES
      value: {{ int64 $s.maxPayloadBytes | quote }}
    - name: AGENT_REACH_DEFAULT_TIMEOUT
      value: {{ $s.defaultTimeout | quote }}
    - name: AGENT_REACH_DEADLINE_RESERVE
      value: {{ $s.deadlineReserve | quote }}
    - name: AGENT_REACH_HEARTBEAT_INTERVAL
      value: {{ $s.heartbeatInterval | quote }}
    - name: AGENT_REACH_PROBE_INTERVAL
      value: {{ $s.probeInterval | quote }}
    - name: AGENT_REACH_CONTROL_TIMEOUT
      value: {{ $s.controlTimeout | quote }}
    - name: AGENT_REACH_WORKER_THREADS
      value: {{ int $s.workerThreads | quote }}
    - name: AGENT_REACH_LOG_FORMAT
      value: {{ $s.logFormat | quote }}
    - name: AGENT_REACH_ADMIN_LISTEN
      value: {{ printf "$(POD_IP):%d" (int $s.adminPort) | quote }}
    {{- if $ctx.Values.identity.enabled }}
    - name: AGENT_REACH_TRUST_DOMAIN
      value: {{ $ctx.Values.identity.trustDomain | quote }}
    - name: AGENT_REACH_TRUST_BUNDLE_FILE
      value: "/etc/agent-reach/identity/ca.crt"
    - name: AGENT_REACH_JOIN_TOKEN_FILE
      value: "/etc/agent-reach/identity/token"
    {{- else }}
    # INSECURE (identity.enabled=false): no certificate, plaintext to control and on the mesh port.
    - name: AGENT_REACH_INSECURE_PLAINTEXT_CONTROL
      value: "true"
    {{- end }}
    - name: RUST_LOG
      value: {{ $s.logLevel | quote }}
  {{- if $ctx.Values.identity.enabled }}
  volumeMounts:
    - name: agent-reach-identity
      mountPath: /etc/agent-reach/identity
      readOnly: true
  {{- end }}
  ports:
    - name: ar-mesh
      containerPort: {{ int $s.meshPort }}
      protocol: TCP
    - name: ar-admin
      containerPort: {{ int $s.adminPort }}
      protocol: TCP
    {{- if eq $mode "daemonset" }}
    - name: ar-local
      containerPort: {{ ternary (int $ds.hostPort) (int $s.localPort) (eq $ds.hostNetwork true) }}
      hostPort: {{ int $ds.hostPort }}
      protocol: TCP
    {{- end }}
  startupProbe:
    httpGet:
      path: /readyz
      port: ar-admin
    periodSeconds: 1
    timeoutSeconds: {{ int $s.probes.timeoutSeconds }}
    failureThreshold: {{ int $s.probes.startupFailureThreshold }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: ar-admin
    periodSeconds: {{ int $s.probes.periodSeconds }}
    timeoutSeconds: {{ int $s.probes.timeoutSeconds }}
    failureThreshold: 2
  livenessProbe:
    httpGet:
      path: /healthz
      port: ar-admin
    periodSeconds: {{ int $s.probes.periodSeconds }}
    timeoutSeconds: {{ int $s.probes.timeoutSeconds }}
    failureThreshold: {{ int $s.probes.livenessFailureThreshold }}
  resources:
    {{- toYaml $s.resources | nindent 4 }}
  securityContext:
    {{- include "agent-reach.containerSecurityContext" $ctx | nindent 4 }}
{{- end -}}

{{/*
=====================================================================================
agent-reach.sidecar.agentEnv — environment entries for the agent container that tell the
agent SDK where its sidecar is (AGENT_REACH_SIDECAR, read by agent_reach::Agent and
agent_reach::Client). Renders list items.

Argument: a dict with `ctx` as above and `daemonset` (optional, bool):
  false (default)  AGENT_REACH_SIDECAR=127.0.0.1:<localPort> (sidecar in the same pod)
  true             AGENT_REACH_SIDECAR=$(NODE_IP):<daemonset.hostPort>, the
                   node's sidecar; also renders POD_IP, the address the agent must serve on
                   so the node's sidecar can reach it.
=====================================================================================
*/}}
{{- define "agent-reach.sidecar.agentEnv" -}}
{{- $ctx := required "agent-reach.sidecar.agentEnv: pass (dict \"ctx\" <agent-reach context>)" .ctx -}}
{{- $s := $ctx.Values.sidecar -}}
{{- if .daemonset -}}
- name: NODE_IP
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: AGENT_REACH_SIDECAR
  value: {{ printf "$(NODE_IP):%d" (int $s.daemonset.hostPort) | quote }}
{{- else -}}
- name: AGENT_REACH_SIDECAR
  value: {{ printf "127.0.0.1:%d" (int $s.localPort) | quote }}
{{- end -}}
{{- end -}}

{{/*
=====================================================================================
agent-reach.sidecar.volumes — the pod volume the sidecar container mounts: the Secret
identity.joinTokenSecret (keys `token` and `ca.crt`).
Renders one list item, nothing when identity.enabled=false. Argument: (dict "ctx" ...).
=====================================================================================
*/}}
{{- define "agent-reach.sidecar.volumes" -}}
{{- $ctx := required "agent-reach.sidecar.volumes: pass (dict \"ctx\" <agent-reach context>)" .ctx -}}
{{- if $ctx.Values.identity.enabled -}}
- name: agent-reach-identity
  secret:
    secretName: {{ $ctx.Values.identity.joinTokenSecret }}
    # 0444 (decimal 292): only the sidecar container mounts it, and pods that use the
    # template may set no fsGroup.
    defaultMode: 292
    items:
      - key: token
        path: token
      - key: ca.crt
        path: ca.crt
{{- end -}}
{{- end -}}
