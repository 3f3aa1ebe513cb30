#!/usr/bin/env bash
# Runs one DecentralizedTrainingJob manifest through the whole user flow on a fresh control plane
# whose trainer pods run for real (up.sh --run-pods), then takes it down:
#
#   up, spot nodes in zones, helm install the chart, the operator out of cluster as the chart's
#   ServiceAccount, kubectl apply the manifest (unchanged; into --namespace), `kubectl get dtj -w`
#   in the background, the disruptions asked for at random moments mid-run, wait for the end,
#   down. The last line of stdout is the job's final status as one JSON object.
#
#   e2e/controlplane/job.sh MANIFEST [--evict N] [--drain-node] [--delete-node]
#                           [--restart-operator] [--zones N] [--nodes-per-zone N]
#                           [--zone-aware on|off] [--steps N] [--set JQ]... [--namespace NS]
#                           [--timeout SECONDS]
#                           [--seed N] [--keep DIR]
#
#   --evict N            evict N running members, one at a time, through the Eviction API
#   --drain-node         kubectl drain a node that runs a member
#   --delete-node        delete a node that runs a member (its machine dies at once)
#   --restart-operator   SIGKILL the operator mid-run and start it again
#   --zones, --nodes-per-zone  the spot nodes (2 CPU, 4 GiB each), default 2 zones of 3
#   --zone-aware on|off  set spec.scheduling.zoneAware   } the manifest is applied as it is
#   --steps N            set spec.training.steps        } unless these are given
#   --set JQ             any other change, as a jq update of the object, e.g.
#                        --set '.spec.replicas = {min: 12, target: 20, max: 24}' 
#   --keep DIR           copy the logs (operator, pods, control plane, the watch) into DIR
#   --dashboard DIR      once a quarter of the steps are done, headless Chromium loads the
#                        operator's dashboard: its DOM (dom.html) and a screenshot into DIR
#
# Needs root, the release build (cargo build --release: murmur and murmur-trainer; or MURMUR_BIN
# and MURMUR_POD_RUNNER_ENTRYPOINT), Go (the control plane is built on first use), jq, curl. Progress goes to stderr. Exit 0 when the job
# succeeded, 1 otherwise.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
say() { echo "job.sh: $*" >&2; }
die() { say "$*"; exit 1; }
usage() { sed -n '/^#   e2e/,/^#   --keep/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

MANIFEST= EVICT=0 DRAIN=0 DELETE_NODE=0 RESTART_OPERATOR=0 ZONES=2 PER_ZONE=3 ZONE_AWARE=
NS=murmur-e2e TIMEOUT=900 SEED=${RANDOM} KEEP= SET_STEPS= DASHBOARD=
EDITS=()
while (($#)); do
    case $1 in
    --evict) EVICT=${2:?--evict N}; shift ;;
    --drain-node) DRAIN=1 ;;
    --delete-node) DELETE_NODE=1 ;;
    --restart-operator) RESTART_OPERATOR=1 ;;
    --zones) ZONES=${2:?--zones N}; shift ;;
    --nodes-per-zone) PER_ZONE=${2:?--nodes-per-zone N}; shift ;;
    --zone-aware) ZONE_AWARE=${2:?--zone-aware on|off}; shift ;;
    --steps) SET_STEPS=${2:?--steps N}; shift ;;
    --set) EDITS+=("${2:?--set JQ}"); shift ;;
    --namespace) NS=${2:?--namespace NS}; shift ;;
    --timeout) TIMEOUT=${2:?--timeout SECONDS}; shift ;;
    --seed) SEED=${2:?--seed N}; shift ;;
    --keep) KEEP=${2:?--keep DIR}; shift ;;
    --dashboard) DASHBOARD=${2:?--dashboard DIR}; shift ;;
    -h | --help) usage ;;
    -*) say "unknown flag $1"; usage ;;
    *) [[ -z $MANIFEST ]] || { say "one manifest only"; usage; }; MANIFEST=$1 ;;
    esac
    shift
done
[[ -n $MANIFEST ]] || usage
[[ -z $KEEP || ! -e $KEEP || -z $(ls -A "$KEEP") ]] || die "--keep $KEEP: not empty"
[[ -f $MANIFEST ]] || die "$MANIFEST: no such file"
[[ $EVICT =~ ^[0-9]+$ ]] || die "--evict $EVICT: not a count"
[[ $ZONES =~ ^[1-9][0-9]*$ && $PER_ZONE =~ ^[1-9][0-9]*$ ]] || die "--zones and --nodes-per-zone: positive counts"
[[ -z $ZONE_AWARE || $ZONE_AWARE == on || $ZONE_AWARE == off ]] || die "--zone-aware $ZONE_AWARE: on or off"
[[ -z $SET_STEPS || $SET_STEPS =~ ^[1-9][0-9]*$ ]] || die "--steps $SET_STEPS: a positive count"
for tool in jq curl; do command -v $tool >/dev/null || die "$tool is needed and not on PATH"; done
if [[ -n $DASHBOARD ]]; then
    BROWSER=$(command -v chromium || command -v chromium-browser || command -v google-chrome) ||
        die "--dashboard needs chromium (apt-get install chromium)"
fi
MURMUR=${MURMUR_BIN:-$REPO/target/release/murmur}
export MURMUR_POD_RUNNER_ENTRYPOINT=${MURMUR_POD_RUNNER_ENTRYPOINT:-$REPO/target/release/murmur-trainer}
[[ -x $MURMUR && -x $MURMUR_POD_RUNNER_ENTRYPOINT ]] ||
    die "the release build is missing: cargo build --release (murmur and murmur-trainer), or set MURMUR_BIN and MURMUR_POD_RUNNER_ENTRYPOINT"
RANDOM=$SEED

# The manifest is checked by the same rules as murmur run and the API server, before anything starts.
"$MURMUR" validate "$MANIFEST" >&2 || die "$MANIFEST: not a valid job manifest"

export MURMUR_CONTROLPLANE_DIR=${MURMUR_CONTROLPLANE_DIR:-$(mktemp -d /tmp/murmur-job.XXXXXX)}
WORK=$MURMUR_CONTROLPLANE_DIR/job
OPERATOR_PID= WATCH_PID= TRACK_PID=
finish() {
    local code=$?
    [[ -n $WATCH_PID ]] && kill "$WATCH_PID" 2>/dev/null
    [[ -n $TRACK_PID ]] && kill "$TRACK_PID" 2>/dev/null
    [[ -n $OPERATOR_PID ]] && kill -TERM "$OPERATOR_PID" 2>/dev/null && wait "$OPERATOR_PID" 2>/dev/null
    if [[ -n $KEEP && -d $MURMUR_CONTROLPLANE_DIR ]]; then
        mkdir -p "$KEEP"
        cp -r "$MURMUR_CONTROLPLANE_DIR/logs" "$KEEP/controlplane" 2>/dev/null || true
        cp -r "$WORK" "$KEEP/job" 2>/dev/null || true
        find "$MURMUR_CONTROLPLANE_DIR/pod-runner/pods" -name container.log 2>/dev/null | while read -r f; do
            cp "$f" "$KEEP/job/$(basename "$(dirname "$f")").log"
        done
    fi
    "$HERE/down.sh" || true
    exit "$code"
}
trap finish EXIT
trap 'exit 130' INT TERM

started=$SECONDS
exports=$("$HERE/up.sh" --run-pods) || die "up.sh failed; its logs are in $MURMUR_CONTROLPLANE_DIR/logs"
eval "$exports"
# shellcheck disable=SC1091
source "$MURMUR_CONTROLPLANE_DIR/env"
mkdir -p "$WORK"
K=$MURMUR_CONTROLPLANE_BIN/kubectl
HELM=$MURMUR_CONTROLPLANE_BIN/helm
HOST=$MURMUR_CONTROLPLANE_HOST_IP
PODNET=${HOST%.*.*} # 10.X
now() { date +%s.%N; }

# --- spot nodes, two zones --------------------------------------------------------------------
# Run by the pod runner (its label, no kwok annotation), spot as Karpenter labels it, each with
# its own /24 of pod addresses, so that a pod's address says its node and zone.
n=0
for ((z = 1; z <= ZONES; z++)); do
    for ((i = 1; i <= PER_ZONE; i++)); do
        n=$((n + 1))
        node=spot-zone$z-$i
        "$K" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $node
  labels:
    kubernetes.io/hostname: $node
    kubernetes.io/os: linux
    topology.kubernetes.io/zone: zone-$z
    karpenter.sh/capacity-type: spot
    murmur.dev/pod-runner: "true"
spec:
  podCIDR: $PODNET.$n.0/24
EOF
        "$K" patch node "$node" --subresource=status --type=merge \
            -p '{"status":{"capacity":{"cpu":"2","memory":"4Gi","pods":"20"},"allocatable":{"cpu":"2","memory":"4Gi","pods":"20"}}}' >/dev/null
    done
done
"$K" wait --for=condition=Ready node -l murmur.dev/pod-runner=true --timeout=60s >/dev/null
"$K" get nodes -o json | jq '[.items[] | {name: .metadata.name, labels: .metadata.labels}]' >"$WORK/nodes.json"
say "$n spot nodes in $ZONES zones"

# --- the chart, and the operator out of cluster as its ServiceAccount ------------------------------
# The chart's Deployment is scaled to 0: there is no image to run here; the same binary runs as a
# process instead, with the chart's ServiceAccount, RBAC and Service name (every pod resolves the
# Service to the host).
HELM_CACHE_HOME=$WORK/helm HELM_CONFIG_HOME=$WORK/helm HELM_DATA_HOME=$WORK/helm \
    "$HELM" install murmur "$REPO/charts/murmur" --namespace murmur-system --create-namespace \
    --set replicaCount=0 >"$WORK/helm.log"
TOKEN=$("$K" create token murmur-operator -n murmur-system --duration=2h)
CA=$(awk '/certificate-authority-data:/ {print $2; exit}' "$KUBECONFIG")
cat >"$WORK/operator.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: murmur, cluster: {server: "$MURMUR_CONTROLPLANE_SERVER", certificate-authority-data: $CA}}]
users: [{name: murmur-operator, user: {token: "$TOKEN"}}]
contexts: [{name: murmur, context: {cluster: murmur, user: murmur-operator, namespace: murmur-system}}]
current-context: murmur
EOF
STATUS=http://$HOST:8470
start_operator() {
    # Whatever answers there now is not ours (an operator of an earlier run that was killed).
    ! curl -s --max-time 2 "$STATUS/healthz" >/dev/null || die "something already serves $STATUS"
    KUBECONFIG=$WORK/operator.kubeconfig RUST_LOG=${MURMUR_E2E_OPERATOR_LOG:-info,kube=warn} \
        "$MURMUR" operator --listen "$HOST:8470" --log-format text \
        >>"$WORK/operator.log" 2>&1 </dev/null &
    OPERATOR_PID=$!
    local deadline=$((SECONDS + 60))
    until curl -sf --max-time 2 "$STATUS/readyz" >/dev/null; do
        kill -0 "$OPERATOR_PID" 2>/dev/null || die "the operator exited: $(tail -5 "$WORK/operator.log")"
        ((SECONDS < deadline)) || die "the operator is not ready after 60 s"
        sleep 0.2
    done
}
start_operator
say "operator ready at $STATUS (pid $OPERATOR_PID)"

# --- the job ---------------------------------------------------------------------------------
# What job.sh needs from the manifest, read by kubectl now that the chart installed the CRD.
"$K" wait --for=condition=Established crd/decentralizedtrainingjobs.murmur.dev --timeout=60s >/dev/null
SPEC=$("$K" create --dry-run=client -o json -f "$MANIFEST" | jq 'del(.metadata.namespace)')
[[ -z $ZONE_AWARE ]] || SPEC=$(jq ".spec.scheduling.zoneAware = $([[ $ZONE_AWARE == on ]] && echo true || echo false)" <<<"$SPEC")
[[ -z $SET_STEPS ]] || SPEC=$(jq ".spec.training.steps = $SET_STEPS" <<<"$SPEC")
for edit in ${EDITS[@]+"${EDITS[@]}"}; do
    SPEC=$(jq "$edit" <<<"$SPEC") || die "--set $edit: not a jq update of the job"
done
JOB=$(jq -r '.metadata.name' <<<"$SPEC")
STEPS=$(jq -r '.spec.training.steps' <<<"$SPEC")
"$K" create namespace "$NS" >/dev/null
if [[ -n $ZONE_AWARE$SET_STEPS${EDITS[*]+x} ]]; then
    "$K" apply -n "$NS" -f - <<<"$SPEC" >/dev/null
else
    "$K" apply -n "$NS" -f "$MANIFEST" >/dev/null # exactly the user's file
fi
applied=$(now)
say "applied $MANIFEST as $NS/$JOB"
job() { "$K" get dtj "$JOB" -n "$NS" -o json 2>/dev/null; }
# The live step, from the operator's status API (the job's status is refreshed every few seconds).
step() { curl -sf --max-time 2 "$STATUS/api/v1/namespaces/$NS/jobs/$JOB" | jq -r '.status.progress.step // 0' || echo 0; }
"$K" get dtj -n "$NS" -w >"$WORK/watch.log" 2>&1 &
WATCH_PID=$!
# Which node each attempt of each member ran on (pods are gone when the job is).
(
    while :; do
        "$K" get pods -n "$NS" -l "murmur.dev/job=$JOB" -o json 2>/dev/null |
            jq -c '.items[] | select(.spec.nodeName != null) | {member: (.metadata.labels["murmur.dev/member"] | tonumber), attempt: (.metadata.labels["murmur.dev/attempt"] | tonumber), pod: .metadata.name, node: .spec.nodeName, podIP: .status.podIP}' \
            >>"$WORK/placements.jsonl" || true
        job | jq -c '{t: now, version: .status.topologyVersion, step: .status.progress.step, phase: .status.phase}' \
            >>"$WORK/versions.jsonl" 2>/dev/null || true
        sleep 1
    done
) &
TRACK_PID=$!

phase() { job | jq -r '.status.phase // ""'; }
# A random running member pod: "pod member node".
running_member() {
    "$K" get pods -n "$NS" -l "murmur.dev/job=$JOB" --field-selector=status.phase=Running -o json |
        jq -r '.items[] | select(.metadata.deletionTimestamp == null) | "\(.metadata.name) \(.metadata.labels["murmur.dev/member"]) \(.spec.nodeName)"' |
        shuf -n1 --random-source=<(yes "$RANDOM")
}
record() { # KIND TARGET MEMBER POD AT: what was done, to whom, when (epoch seconds)
    jq -nc --arg kind "$1" --arg target "$2" --argjson member "$3" --arg pod "$4" --argjson at "$5" \
        '{kind: $kind, target: $target, member: $member, pod: (if $pod == "" then null else $pod end), at: $at}' >>"$WORK/disruptions.jsonl"
}

# The disruptions, each at a random step between 15% and 65% of the run, in order.
plan=()
for ((i = 0; i < EVICT; i++)); do plan+=(evict); done
((DRAIN)) && plan+=(drain)
((DELETE_NODE)) && plan+=(delete-node)
((RESTART_OPERATOR)) && plan+=(restart-operator)
at=()
if ((${#plan[@]})); then
    mapfile -t plan < <(printf '%s\n' "${plan[@]}" | shuf --random-source=<(yes "$RANDOM"))
    for ((i = 0; i < ${#plan[@]}; i++)); do
        at+=($((STEPS * (15 + RANDOM % 50) / 100)))
    done
    mapfile -t at < <(printf '%s\n' "${at[@]}" | sort -n)
fi
deadline=$((SECONDS + TIMEOUT))
for ((i = 0; i < ${#plan[@]}; i++)); do
    kind=${plan[$i]}
    until (($(step) >= at[i])); do
        p=$(phase)
        [[ $p == Succeeded || $p == Failed ]] && die "the job ended ($p) before the $kind planned at step ${at[$i]}"
        ((SECONDS < deadline)) || die "timed out waiting for step ${at[$i]}"
        sleep 0.5
    done
    case $kind in
    evict)
        read -r pod member node < <(running_member)
        say "step $(step): evicting $pod (member $member, on $node)"
        record evict "$pod" "$member" "$pod" "$(now)"
        "$K" create --raw "/api/v1/namespaces/$NS/pods/$pod/eviction" -f - >/dev/null <<EOF
{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "$pod", "namespace": "$NS"}}
EOF
        ;;
    drain)
        read -r pod member node < <(running_member)
        say "step $(step): draining $node (member $member)"
        record drain "$node" "$member" "$pod" "$(now)"
        "$K" drain "$node" --ignore-daemonsets --delete-emptydir-data --force --timeout=120s >>"$WORK/drain.log" 2>&1
        ;;
    delete-node)
        read -r pod member node < <(running_member)
        say "step $(step): deleting node $node (member $member)"
        record delete-node "$node" "$member" "$pod" "$(now)"
        "$K" delete node "$node" --wait=false >/dev/null
        ;;
    restart-operator)
        say "step $(step): killing the operator (pid $OPERATOR_PID) and starting it again"
        record restart-operator operator null "" "$(now)"
        kill -KILL "$OPERATOR_PID"
        wait "$OPERATOR_PID" 2>/dev/null || true
        sleep 2
        start_operator
        ;;
    esac
done

# --- the dashboard, as a user opens it mid-run -------------------------------------------------
if [[ -n $DASHBOARD ]]; then
    until (($(step) >= STEPS / 4)); do
        p=$(phase)
        [[ $p == Succeeded || $p == Failed ]] && die "the job ended ($p) before the dashboard was looked at"
        ((SECONDS < deadline)) || die "timed out waiting for step $((STEPS / 4))"
        sleep 0.5
    done
    mkdir -p "$DASHBOARD"
    chrome=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars
        --window-size=1400,1000 --virtual-time-budget=4000)
    "$BROWSER" "${chrome[@]}" --dump-dom "$STATUS/" >"$DASHBOARD/dom.html" 2>>"$WORK/chromium.log"
    "$BROWSER" "${chrome[@]}" --screenshot="$DASHBOARD/dashboard.png" "$STATUS/" >>"$WORK/chromium.log" 2>&1
    say "step $(step): the operator's dashboard captured in $DASHBOARD"
fi

# --- the end ---------------------------------------------------------------------------------
until p=$(phase) && [[ $p == Succeeded || $p == Failed ]]; do
    ((SECONDS < deadline)) || die "the job did not end within ${TIMEOUT}s (phase ${p:-none})"
    sleep 1
done
ended=$(now)
say "job $NS/$JOB: $p after $(jq -n "$ended - $applied | floor") s"
curl -sf "$STATUS/api/v1/namespaces/$NS/jobs/$JOB" >"$WORK/view.json" || echo '{}' >"$WORK/view.json"
job >"$WORK/job.json"
[[ -s $WORK/disruptions.jsonl ]] || : >"$WORK/disruptions.jsonl"
# The trainers' own log lines, with the pod each came from: when each adopted a topology, and
# when each had its first averaging round.
for f in "$MURMUR_CONTROLPLANE_DIR"/pod-runner/pods/"${NS}"_*/container.log; do
    [[ -f $f ]] || continue
    pod=$(basename "$(dirname "$f")" | sed "s/^${NS}_//; s/_[^_]*$//")
    jq -c --arg pod "$pod" 'select(.fields.message == "following topology" or .fields.message == "first averaging round with peers")
        | {pod: $pod, message: .fields.message, version: .fields.version,
           t: ((.timestamp | sub("\\.[0-9]+Z$"; "Z") | fromdateiso8601) + (.timestamp | capture("(?<f>\\.[0-9]+)Z$").f // "0" | tonumber))}' \
        "$f" 2>/dev/null || true
done >"$WORK/trainer-events.jsonl"
touch "$WORK/versions.jsonl"
jq -n --slurpfile job "$WORK/job.json" --slurpfile view "$WORK/view.json" \
    --slurpfile nodes "$WORK/nodes.json" --slurpfile placements "$WORK/placements.jsonl" \
    --slurpfile disruptions "$WORK/disruptions.jsonl" --slurpfile trainer "$WORK/trainer-events.jsonl" \
    --slurpfile versions "$WORK/versions.jsonl" \
    --argjson applied "$applied" --argjson ended "$ended" --argjson total "$((SECONDS - started))" '
    ($job[0].status) as $s
    | ($nodes[0] | map({(.name): .labels}) | add) as $labels
    | {
        job: $job[0].metadata.name, namespace: $job[0].metadata.namespace,
        phase: $s.phase, finalAccuracy: $s.progress.accuracy, step: $s.progress.step,
        preemptions: $s.preemptions, restarts: $s.restarts, relocations: ($s.relocations // 0),
        topologyVersion: $s.topologyVersion,
        jobSeconds: ($ended - $applied), wallSeconds: $total,
        members: ($placements | unique_by(.pod) | sort_by(.member, .attempt)
            | map(. + {nodeLabels: ($labels[.node] // {})})),
        memberStatus: $s.members, view: $view[0],
        disruptions: ($disruptions | map(. + {atSeconds: (.at - $applied)})),
        # Per member lost: from the API call to the survivors first following a topology without
        # it, and to the first averaging round of its replacement (its next attempt).
        healing: [$disruptions[] | select(.pod != null) | . as $d
            | ($d.pod | capture("^(?<base>.*)-(?<attempt>[0-9]+)$")) as $p
            | "\($p.base)-\($p.attempt | tonumber + 1)" as $replacement
            | {kind: $d.kind, member: $d.member, pod: $d.pod, replacement: $replacement,
               survivorsSeconds: ([$trainer[] | select(.message == "following topology" and .t > $d.at and (.pod | startswith("\($p.base)-") | not)) | .t] | min | if . then . - $d.at else null end),
               replacementSeconds: ([$trainer[] | select(.message == "first averaging round with peers" and .pod == $replacement) | .t] | min | if . then . - $d.at else null end)}],
        versionsMonotonic: ([$versions[] | .version // 0] | . as $v | [range(1; length)] | all($v[.] >= $v[. - 1])),
        stepsMonotonic: ([$versions[] | .step // 0] | . as $v | [range(1; length)] | all($v[.] >= $v[. - 1]))
      }' >"$WORK/result.json"
jq -c 'del(.view)' "$WORK/result.json"
[[ $p == Succeeded ]]
