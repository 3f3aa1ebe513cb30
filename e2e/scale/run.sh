#!/usr/bin/env bash
# The operator at scale, on the project's real control plane: kwok nodes, one DecentralizedTraining
# Job of N members, and simulated trainers (the scale-loadgen example: signed joins and statuses
# at a trainer's cadence, each member following its own topology view on its view stream).
# Measures what the operator costs the API server and its own process, and what one topology
# change costs the control endpoint. The last line of stdout is one JSON object:
#
#   members                N
#   extraPods              pods the operator created beyond one a member while the job came up
#                          (a member's second pod beside its first); the run fails unless 0
#   podsCreatedSeconds     apply -> N pods exist
#   firstTopologySeconds   the last member's join sent -> every member holds its view
#   writesPerMember        the operator's writes (API server audit log), apply -> every member
#                          Running, in the topology and labelled with its clique, per member
#   steadyWritesPerMinute  the operator's writes to the job's namespace while the running job
#                          stays unchanged (--steady seconds)
#   operatorRssMiB         the operator's peak resident memory
#   topologyBytesPerChange topology bytes the members received per topology version, over one
#                          member deleted and replaced (its leave and its join)
#   reconcileP99Ms         99th percentile of a reconcile's work (deciding and handing its writes
#                          to the job's writer), from the operator's histogram
#   reconcileCpuP99Ms      99th percentile of the CPU time a reconcile's work takes on its thread:
#                          reconcileP99Ms less the time it waited for a core (the API server, etcd,
#                          kwok and the load generator share this machine's)
#   writeRoundP99Ms        99th percentile of a round of the job's writes behind its reconciles
#                          (the API server's answers included), from the operator's histogram
#   apiWriteP50Ms, apiWriteP99Ms  the API server's own time answering the operator's writes
#                          (audit log: received -> response complete), over the whole run
#
#   e2e/scale/run.sh --members N [--steady SECONDS] [--status-every SECONDS] [--keep DIR]
#                    [--operator BINARY --follow document]
#
#   --operator BINARY  run this murmur binary as the operator (another build, for a before/after
#                      table); --follow document makes the members follow the whole document,
#                      for an operator that serves no views
#
# Needs root (file limits), Go (the control plane is built on first use), jq, curl. Builds the
# operator and the load generator with cargo's `operator` profile (the operator image's: release
# with fat LTO, Cargo.toml). Progress goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck disable=SC2034 # read by say.sh
SAY_AS=scale
# shellcheck source=../support/say.sh
source "$HERE/../support/say.sh"
usage() { sed -n '/^#   e2e\/scale/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

MEMBERS='' STEADY=120 STATUS_EVERY=10 KEEP='' OPERATOR='' FOLLOW=view
while (($#)); do
    case $1 in
    --members) MEMBERS=${2:?}; shift 2 ;;
    --steady) STEADY=${2:?}; shift 2 ;;
    --status-every) STATUS_EVERY=${2:?}; shift 2 ;;
    --keep) KEEP=${2:?}; shift 2 ;;
    --operator) OPERATOR=${2:?}; shift 2 ;;
    --follow) FOLLOW=${2:?}; shift 2 ;;
    *) usage ;;
    esac
done
[[ $MEMBERS =~ ^[1-9][0-9]*$ ]] || usage
for tool in jq curl; do command -v "$tool" >/dev/null || die "$tool is needed"; done
# Every member holds a long-poll open to the operator, and the load generator one per member too.
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"

now_ms() { date +%s%3N; }
WORK=$(mktemp -d /tmp/murmur-scale.XXXXXX)
export MURMUR_CONTROLPLANE_DIR=$WORK/cp
OPERATOR_PID='' LOADGEN_PID=''
cleanup() {
    local rc=$?
    for pid in $LOADGEN_PID $OPERATOR_PID; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [[ -n $KEEP ]]; then
        mkdir -p "$KEEP"
        cp -r "$WORK"/*.log "$WORK"/*.json "$MURMUR_CONTROLPLANE_DIR/logs" "$KEEP/" 2>/dev/null || true
    fi
    "$REPO/e2e/controlplane/down.sh" >/dev/null 2>&1 || true
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

say "building the operator and the load generator (the operator profile)"
(cd "$REPO" && cargo build --profile operator --locked -q -p murmur --bin murmur --example scale-loadgen)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
MURMUR=${OPERATOR:-$TARGET/operator/murmur}
LOADGEN=$TARGET/operator/examples/scale-loadgen

# The API server's audit log: the operator's writes, at Metadata level, and nothing else.
OPERATOR_USER=system:serviceaccount:murmur-system:murmur-operator
cat >"$WORK/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["$OPERATOR_USER"]
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
EOF
export MURMUR_CONTROLPLANE_APISERVER_ARGS="--audit-policy-file=$WORK/audit-policy.yaml --audit-log-path=$WORK/audit.log --audit-log-maxsize=0 --audit-log-mode=batch"
eval "$("$REPO/e2e/controlplane/up.sh")"
K=$MURMUR_CONTROLPLANE_BIN/kubectl

# The chart's CRD, ServiceAccount and RBAC (its Deployment is not run: the operator runs here, as
# that ServiceAccount, so that the audit log tells its writes apart).
"$K" apply --server-side -f "$REPO/manifests/install.yaml" >/dev/null
"$K" -n murmur-system scale deployment/murmur-operator --replicas=0 >/dev/null
"$K" wait --for=condition=Established crd/decentralizedtrainingjobs.murmur.dev --timeout=60s >/dev/null
TOKEN=$("$K" -n murmur-system create token murmur-operator --duration=24h)
OPERATOR_KUBECONFIG=$WORK/operator.kubeconfig
"$K" config view --raw --minify --flatten >"$OPERATOR_KUBECONFIG"
KUBECONFIG=$OPERATOR_KUBECONFIG "$K" config set-credentials scale-operator --token="$TOKEN" >/dev/null
KUBECONFIG=$OPERATOR_KUBECONFIG "$K" config set-context --current --user=scale-operator >/dev/null
# Who reads the operator's /metrics here.
"$K" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: scale-reader, namespace: murmur-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: scale-reader}
rules: [{nonResourceURLs: ["/metrics"], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: scale-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: scale-reader}
subjects: [{kind: ServiceAccount, name: scale-reader, namespace: murmur-system}]
EOF
READER=$("$K" -n murmur-system create token scale-reader --duration=24h)

# kwok nodes: 100 members a node, in one zone (zone-aware placement is measured elsewhere: here
# it would relocate members between zones the scheduler fills as it likes).
NODES=$(((MEMBERS + 99) / 100))
say "$NODES kwok nodes for $MEMBERS members"
for ((i = 0; i < NODES; i++)); do
    cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: scale-$i
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {kubernetes.io/hostname: scale-$i, type: kwok, topology.kubernetes.io/zone: zone-0}
status:
  allocatable: {cpu: "1000", memory: 4Ti, pods: "110"}
  capacity: {cpu: "1000", memory: 4Ti, pods: "110"}
---
EOF
done | "$K" apply -f - >/dev/null
"$K" wait --for=condition=Ready node --all --timeout=120s >/dev/null

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE=http://127.0.0.1:$PORT
say "operator on $BASE"
KUBECONFIG=$OPERATOR_KUBECONFIG RUST_LOG=${MURMUR_SCALE_LOG:-info,kube=warn} "$MURMUR" operator \
    --listen "127.0.0.1:$PORT" --control-endpoint "$BASE" --operator-namespace murmur-system \
    --log-format json >"$WORK/operator.log" 2>&1 &
OPERATOR_PID=$!
for _ in $(seq 300); do curl -sf "$BASE/readyz" >/dev/null && break; sleep 0.2; done
curl -sf "$BASE/readyz" >/dev/null || die "the operator is not ready: $(tail -5 "$WORK/operator.log")"

metrics() { curl -sf -H "Authorization: Bearer $READER" "$BASE/metrics"; }
# sum_metric NAME [LABEL-FILTER]: the sum of a metric's samples.
sum_metric() { metrics | awk -v n="$1" -v f="${2:-}" '$1 ~ "^"n"({|$)" && index($1, f) { s += $2 } END { printf "%.0f\n", s }'; }
# An audit timestamp (RFC 3339, fractional seconds) in milliseconds since the epoch.
AUDIT_MS='def ms: (sub("\\.[0-9]+Z$"; "Z") | fromdate) * 1000
    + ((capture("\\.(?<f>[0-9]+)Z$").f // "0") | ("0." + .) | tonumber) * 1000;'
audit_writes() { # FROM_MS TO_MS [NAMESPACE]: the operator's writes received in [FROM, TO)
    jq -rs --argjson from "$1" --argjson to "$2" --arg ns "${3:-}" "$AUDIT_MS"'
        map(select(.stage == "ResponseComplete")
            | select(($ns == "") or (.objectRef.namespace == $ns))
            | (.requestReceivedTimestamp | ms) as $ms
            | select($ms >= $from and $ms < $to)) | length' "$WORK/audit.log"
}
# The API server's own time answering the operator's writes (received -> response complete), in
# ms: [p50, p99] over the whole run. A reconcile that makes a write waits at least this long.
audit_answer_ms() {
    jq -cs "$AUDIT_MS"'
        [.[] | select(.stage == "ResponseComplete")
            | ((.stageTimestamp | ms) - (.requestReceivedTimestamp | ms))] | sort
        | if length == 0 then [null, null]
          else [.[(length * 0.5 | floor)], .[((length * 0.99 | ceil) - 1)]] | map(. * 10 | round / 10) end' \
        "$WORK/audit.log"
}

NS=scale
"$K" create namespace "$NS" >/dev/null
cat >"$WORK/job.yaml" <<EOF
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: big, namespace: $NS}
spec:
  replicas: {min: $(((MEMBERS * 9 + 9) / 10)), target: $MEMBERS, max: $MEMBERS}
  topology: {kind: dCliques, cliqueSize: 10}
  algorithm: {kind: dpsgd}
  training: {model: mlp, steps: 100000000}
EOF

"$LOADGEN" --control "$BASE" --namespace "$NS" --job big --members "$MEMBERS" \
    --status-every "$STATUS_EVERY" --follow "$FOLLOW" --out "$WORK/loadgen.json" >"$WORK/loadgen.log" 2>&1 &
LOADGEN_PID=$!
APPLIED=$(now_ms)
"$K" apply -f "$WORK/job.yaml" >/dev/null
say "applied a job of $MEMBERS members"
figure() { jq -r ".$1" "$WORK/loadgen.json" 2>/dev/null || echo 0; }
deadline=$((SECONDS + 900))
until [[ -f $WORK/loadgen.json ]] && (($(figure allViewsAtMs) > 0)); do
    ((SECONDS < deadline)) || die "not every member got a view within 900 s: $(cat "$WORK/loadgen.json" 2>/dev/null)"
    kill -0 "$OPERATOR_PID" 2>/dev/null || die "the operator exited: $(tail -5 "$WORK/operator.log")"
    sleep 2
    say "pods $(figure pods), running $(figure running), joined $(figure joined), with a view $(figure withView)"
done
UP=$(now_ms)
cp "$WORK/loadgen.json" "$WORK/up.json"
PODS_AT=$(jq .allPodsAtMs "$WORK/up.json")
LAST_JOIN=$(jq .lastJoinAtMs "$WORK/up.json")
VIEWS_AT=$(jq .allViewsAtMs "$WORK/up.json")
say "up: pods after $(((PODS_AT - APPLIED) / 1000)) s, every view $(((VIEWS_AT - LAST_JOIN)))ms after the last join"
# The job is up once every pod carries its clique label too (the operator's last writes of it).
deadline=$((SECONDS + 600))
labelled() { "$K" -n "$NS" get pods -l murmur.dev/job=big,murmur.dev/clique --no-headers 2>/dev/null | wc -l; }
until (($(labelled) >= MEMBERS)); do
    ((SECONDS < deadline)) || die "the pods were not all labelled with their clique within 600 s"
    sleep 2
done
UP=$(now_ms)
say "every pod labelled with its clique $(((UP - VIEWS_AT) / 1000)) s after the last view"
sleep 5 # the audit log is written in batches
WRITES_UP=$(audit_writes "$APPLIED" "$UP")
# Pods created beyond one a member while the job came up: nothing was lost, so each is a member's
# second pod beside its first.
EXTRA_PODS=$(($(jq -rs --argjson from "$APPLIED" --argjson to "$UP" "$AUDIT_MS"'
    map(select(.stage == "ResponseComplete" and .verb == "create"
            and .objectRef.resource == "pods" and .responseStatus.code == 201)
        | (.requestReceivedTimestamp | ms) as $ms | select($ms >= $from and $ms < $to))
    | length' "$WORK/audit.log") - MEMBERS))

say "steady for $STEADY s"
STEADY_FROM=$(now_ms)
sleep "$STEADY"
STEADY_TO=$(now_ms)
sleep 5
WRITES_STEADY=$(audit_writes "$STEADY_FROM" "$STEADY_TO" "$NS")

say "one member deleted and replaced"
BYTES_BEFORE=$(figure viewBytes)
VERSION_BEFORE=$(sum_metric murmur_job_topology_version)
VICTIM=$("$K" -n "$NS" get pods -l murmur.dev/job=big -o jsonpath='{.items[0].metadata.name}')
"$K" -n "$NS" delete pod "$VICTIM" --wait=false >/dev/null
deadline=$((SECONDS + 300))
phase() { "$K" -n "$NS" get dtj big -o jsonpath='{.status.phase}'; }
until (($(sum_metric murmur_job_topology_version) > VERSION_BEFORE)) && [[ $(phase) == Running ]]; do
    ((SECONDS < deadline)) || die "the topology did not take the replacement in within 300 s"
    sleep 1
done
sleep 10 # the views of the change are served
BYTES_AFTER=$(figure viewBytes)
VERSION_AFTER=$(sum_metric murmur_job_topology_version)

# A quantile of one of the operator's histograms, interpolated within its bucket (the top bucket's
# lower bound when it falls there): quantile NAME Q.
quantile() { metrics | awk -v name="$1" -v q="$2" '
    index($0, name "_bucket{") == 1 {
        match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
        n++; bound[n] = (le == "+Inf") ? -1 : le; count[n] = $2 }
    END {
        total = count[n]; want = q * total; lo = 0; below = 0
        for (i = 1; i <= n; i++) {
            if (count[i] >= want) {
                hi = (bound[i] < 0) ? lo : bound[i]
                inb = count[i] - below
                f = (inb > 0) ? (want - below) / inb : 1
                printf "%.1f\n", (lo + f * (hi - lo)) * 1000; exit }
            lo = bound[i]; below = count[i] } }'; }
P99=$(quantile murmur_operator_reconcile_duration_seconds 0.99)
P50=$(quantile murmur_operator_reconcile_duration_seconds 0.5)
CPU_P99=$(quantile murmur_operator_reconcile_cpu_seconds 0.99)
CPU_P50=$(quantile murmur_operator_reconcile_cpu_seconds 0.5)
RECONCILES=$(sum_metric murmur_operator_reconciles_total)
ROUND_P99=$(quantile murmur_operator_write_round_duration_seconds 0.99)
ROUND_P50=$(quantile murmur_operator_write_round_duration_seconds 0.5)
ROUNDS=$(sum_metric murmur_operator_write_rounds_total)
ANSWERS=$(audit_answer_ms)
RSS=$(awk '/VmHWM/ { printf "%.0f\n", $2 / 1024 }' "/proc/$OPERATOR_PID/status")
cp "$WORK/loadgen.json" "$WORK/end.json"

jq -cn --argjson members "$MEMBERS" \
    --argjson pods "$(((PODS_AT - APPLIED)))" --argjson topo "$((VIEWS_AT - LAST_JOIN))" \
    --argjson writes "$WRITES_UP" --argjson steady "$WRITES_STEADY" --argjson window "$((STEADY_TO - STEADY_FROM))" \
    --argjson rss "$RSS" --argjson bytes "$((BYTES_AFTER - BYTES_BEFORE))" \
    --argjson versions "$((VERSION_AFTER - VERSION_BEFORE))" --argjson p99 "${P99:-null}" \
    --argjson p50 "${P50:-null}" --argjson cpuP99 "${CPU_P99:-null}" --argjson cpuP50 "${CPU_P50:-null}" \
    --argjson reconciles "$RECONCILES" --argjson answers "$ANSWERS" \
    --argjson roundP99 "${ROUND_P99:-null}" --argjson roundP50 "${ROUND_P50:-null}" --argjson rounds "${ROUNDS:-0}" \
    --argjson statusEvery "$STATUS_EVERY" --arg follow "$FOLLOW" --slurpfile last "$WORK/end.json" \
    --argjson extra "$EXTRA_PODS" '{
        members: $members,
        extraPods: $extra,
        podsCreatedSeconds: ($pods / 1000),
        firstTopologySeconds: ($topo / 1000),
        writesPerMember: (($writes / $members) * 100 | round / 100),
        steadyWritesPerMinute: (($steady * 60000 / $window) * 10 | round / 10),
        operatorRssMiB: $rss,
        topologyBytesPerChange: (if $versions > 0 then ($bytes / $versions | round) else null end),
        reconcileP99Ms: $p99,
        reconcileP50Ms: $p50,
        reconcileCpuP99Ms: $cpuP99,
        reconcileCpuP50Ms: $cpuP50,
        reconciles: $reconciles,
        writeRoundP99Ms: $roundP99,
        writeRoundP50Ms: $roundP50,
        writeRounds: $rounds,
        apiWriteP50Ms: $answers[0],
        apiWriteP99Ms: $answers[1],
        statusEverySeconds: $statusEvery,
        follow: $follow,
        loadErrors: $last[0].errors
    }' | tee "$WORK/figures.json"
((EXTRA_PODS == 0)) || die "the operator created $EXTRA_PODS pods beyond one a member while the job came up"
