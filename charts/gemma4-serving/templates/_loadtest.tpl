{{/*
The load-test Job spec, shared by the standalone Job (loadtest-job.yaml) and the `helm test`
hook (tests/loadtest-test.yaml). Call with (dict "ctx" $ "mode" .Values.loadtest.job), plus
"ttl" (ttlSecondsAfterFinished) and "runId" (the standalone Job's run, a pod label) where set.
*/}}
{{- define "gemma4-serving.loadtestJobSpec" -}}
{{- $ := .ctx }}
{{- $lt := $.Values.loadtest }}
{{- $mode := .mode }}
{{- $settings := merge (deepCopy (default dict $mode.settings)) (deepCopy (default dict $lt.settings)) -}}
{{- /* The request body keys slo-loadtest sets itself (slo_loadtest.validation.RESERVED_BODY_KEYS;
charts/tests/test_loadtest_contract.py keeps the two lists equal). */}}
{{- $reserved := list "model" "messages" "stream" "stream_options" "max_tokens" "max_completion_tokens" "ignore_eos" "stop" }}
{{- range $key, $_ := (default dict $lt.extraBody) }}
{{- if has $key $reserved }}
{{- fail (printf "loadtest.extraBody.%s: slo-loadtest sets %q itself (it fixes the workload's model, prompt, streaming and output length); refused keys: %s" $key $key (join ", " $reserved)) }}
{{- end }}
{{- end }}
{{- if $lt.extraBody }}
{{- range $key, $_ := $settings }}
{{- if eq (upper $key) "EXTRA_BODY" }}
{{- fail (printf "loadtest.extraBody and the setting %q both set the request body: set it once, in loadtest.extraBody" $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $lt.extraEnv }}
{{- if has .name (list "HEALTH_WAIT_SECONDS" "KEEP_RESULTS_SECONDS") }}
{{- fail (printf "loadtest.extraEnv: %s is set by the chart; use loadtest.%s" .name (eq .name "HEALTH_WAIT_SECONDS" | ternary "healthWaitSeconds" "job.keepResultsSeconds / loadtest.helmTest.keepResultsSeconds")) }}
{{- end }}
{{- end }}
backoffLimit: 0
activeDeadlineSeconds: {{ $mode.activeDeadlineSeconds }}
{{- with .ttl }}
ttlSecondsAfterFinished: {{ . }}
{{- end }}
template:
  metadata:
    labels:
      {{- if .runId }}
      {{- /* The standalone Job: its name carries a hash of this pod template (loadtestJobName),
      so a change here is a new Job, a new run. Hence no chart version or appVersion labels (every
      chart bump would start a run even with a pinned image); commonLabels are here (a change of
      them starts a new run). */}}
      {{- include "gemma4-serving.loadtestSelectorLabels" $ | nindent 6 }}
      app.kubernetes.io/part-of: gemma4-serving
      app.kubernetes.io/managed-by: {{ $.Release.Service }}
      {{- with $.Values.commonLabels }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      gemma4-serving/loadtest-run: {{ .runId | quote }}
      {{- else }}
      {{- /* The helm test hook: recreated on every `helm test`, so it carries the full labels. */}}
      {{- include "gemma4-serving.labels" $ | nindent 6 }}
      app.kubernetes.io/component: loadtest
      {{- end }}
  spec:
    restartPolicy: Never
    serviceAccountName: {{ include "gemma4-serving.serviceAccountName" $ }}
    automountServiceAccountToken: false
    enableServiceLinks: false
    {{- with $.Values.imagePullSecrets }}
    imagePullSecrets:
      {{- include "gemma4-serving.imagePullSecrets" $ | trim | nindent 6 }}
    {{- end }}
    securityContext:
      runAsNonRoot: true
      runAsUser: 10001
      runAsGroup: 10001
      fsGroup: 10001
      seccompProfile:
        type: RuntimeDefault
    {{- with $lt.nodeSelector }}
    nodeSelector:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $lt.tolerations }}
    tolerations:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $lt.affinity }}
    affinity:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    containers:
      - name: loadtest
        image: {{ include "gemma4-serving.imageRef" (dict "image" $lt.image "ctx" $) | quote }}
        imagePullPolicy: {{ $lt.image.pullPolicy }}
        # Wait for the server, run the sweep, mark the results, keep them fetchable, exit with
        # slo-loadtest's code. The sweep's own arguments arrive as "$@" (never spliced into
        # the script).
        command:
          - /bin/sh
          - -c
          - |
            set -u
            # sh is PID 1 in the pod: the kernel drops every signal PID 1 has no handler for, so SIGTERM
            # (activeDeadlineSeconds, kubectl delete) reaches slo-loadtest only through these traps.
            trap 'exit 143' TERM INT
            wait_s="${HEALTH_WAIT_SECONDS:-900}"
            echo "slo-loadtest job: waiting up to ${wait_s}s for $SLO_LOADTEST_TARGET/health"
            start=$(date +%s)
            until python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=5)' "$SLO_LOADTEST_TARGET" 2>/dev/null; do
              if [ $(($(date +%s) - start)) -ge "$wait_s" ]; then
                # a wrong target must not burn the whole deadline: the sweep's preflight reports it (exit 3)
                echo "slo-loadtest job: no answer from $SLO_LOADTEST_TARGET/health after ${wait_s}s; running the sweep anyway"
                break
              fi
              sleep 5
            done
            mkdir -p "$SLO_LOADTEST_OUT"
            rm -f "$SLO_LOADTEST_OUT/.done"
            term=0
            slo-loadtest run --target "$SLO_LOADTEST_TARGET" --out "$SLO_LOADTEST_OUT" "$@" &
            pid=$!
            trap 'term=1; kill -TERM "$pid" 2>/dev/null' TERM INT
            wait "$pid"
            rc=$?
            # a trapped signal ends `wait` early: wait on until slo-loadtest has written its partial report
            while kill -0 "$pid" 2>/dev/null; do
              wait "$pid"
              rc=$?
            done
            echo "$rc" > "$SLO_LOADTEST_OUT/exit_code"
            touch "$SLO_LOADTEST_OUT/.done"
            if [ "$term" = 1 ]; then
              echo "slo-loadtest job: results ready in $SLO_LOADTEST_OUT (exit code $rc); terminated, not keeping them"
              exit "$rc"
            fi
            echo "slo-loadtest job: results ready in $SLO_LOADTEST_OUT (exit code $rc); keeping them for ${KEEP_RESULTS_SECONDS}s"
            sleep "$KEEP_RESULTS_SECONDS" &
            spid=$!
            trap 'kill "$spid" 2>/dev/null; exit "$rc"' TERM INT
            wait "$spid"
            exit "$rc"
          - slo-loadtest-job
        {{- with $mode.args }}
        args:
          {{- range . }}
          - {{ toString . | quote }}
          {{- end }}
        {{- end }}
        env:
          - name: SLO_LOADTEST_TARGET
            value: {{ include "gemma4-serving.serviceURL" $ | quote }}
          - name: SLO_LOADTEST_OUT
            value: /results
          # the Pushgateway group of this release (a push to the Pushgateway replaces only it)
          - name: SLO_LOADTEST_PUSH_RELEASE
            value: {{ get $settings "push_release" | default (printf "%s/%s" $.Release.Namespace $.Release.Name) | toString | quote }}
          - name: KEEP_RESULTS_SECONDS
            value: {{ $mode.keepResultsSeconds | quote }}
          - name: HEALTH_WAIT_SECONDS
            value: {{ $lt.healthWaitSeconds | quote }}
          - name: HOME
            value: /tmp
          - name: MPLCONFIGDIR
            value: /tmp/matplotlib
          {{- range $key, $val := $settings }}
          {{- if not (has (upper $key) (list "TARGET" "PUSH_RELEASE")) }}
          - name: {{ printf "SLO_LOADTEST_%s" (upper $key) }}
            value: {{ toString $val | quote }}
          {{- end }}
          {{- end }}
          {{- with $lt.extraBody }}
          - name: SLO_LOADTEST_EXTRA_BODY
            value: {{ toJson . | quote }}
          {{- end }}
          {{- with $.Values.server.apiKey.existingSecret }}
          - name: SLO_LOADTEST_API_KEY
            valueFrom:
              secretKeyRef:
                name: {{ . }}
                key: {{ $.Values.server.apiKey.key }}
          {{- end }}
          {{- with $lt.extraEnv }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        resources:
          {{- toYaml $lt.resources | nindent 10 }}
        securityContext:
          runAsNonRoot: true
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities:
            drop:
              - ALL
        volumeMounts:
          - name: results
            mountPath: /results
          - name: tmp
            mountPath: /tmp
    volumes:
      - name: results
        {{- if $lt.results.persistence.enabled }}
        persistentVolumeClaim:
          claimName: {{ default (include "gemma4-serving.suffixedName" (dict "ctx" $ "suffix" "loadtest-results")) $lt.results.persistence.existingClaim }}
        {{- else }}
        emptyDir: {}
        {{- end }}
      - name: tmp
        emptyDir: {}
{{- end }}

{{/*
The standalone Job's name, <fullname>-loadtest-<runId>-<sha8>: sha8 is the first 8 hex digits of
the sha256 of its rendered pod template (toYaml). A Job's pod template is immutable, so anything
that changes it (image tag, appVersion as the default tag, settings, args, env, service account,
pull secrets, API key Secret, target URL, resources, scheduling, commonLabels) makes a new Job,
i.e. a new run, instead of an upgrade Kubernetes refuses; the same values and runId render the
same name and spec on every revision, and Helm leaves that Job alone. The full name is cut so
the whole fits 63 characters. Call with the chart context.
*/}}
{{- define "gemma4-serving.loadtestJobName" -}}
{{- $runId := toString .Values.loadtest.job.runId }}
{{- $spec := include "gemma4-serving.loadtestJobSpec" (dict "ctx" . "mode" .Values.loadtest.job "ttl" .Values.loadtest.job.ttlSecondsAfterFinished "runId" $runId) | fromYaml }}
{{- $sha := toYaml $spec.template | sha256sum | trunc 8 }}
{{- include "gemma4-serving.suffixedName" (dict "ctx" . "suffix" (printf "loadtest-%s-%s" $runId $sha)) }}
{{- end }}
