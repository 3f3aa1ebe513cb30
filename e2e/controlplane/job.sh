#!/usr/bin/env bash
# Runs one DecentralizedTrainingJob manifest through a user's whole flow on a fresh control plane
# with real nodes, then takes it down:
#
#   the images built from images/*.Dockerfile (the given binaries on a Debian base made here) and
#   imported into the nodes' containerd; up.sh --real-nodes; an on-demand system node and spot
#   nodes in zones (nodes.sh: containerd, runc, CNI, the kubelet, kube-proxy; CoreDNS); helm
#   install of the chart with those images, the operator running in the cluster as the chart's
#   Deployment; kubectl apply of the manifest (unchanged, into --namespace); `kubectl get dtj -w`
#   and `kubectl logs -f` of every pod in the background; the disruptions asked for, each at a
#   random step mid-run; the end; down. The last line of stdout is the job's final status as one
#   JSON object, whatever happened (an "error" field says what went wrong).
#
#   e2e/controlplane/job.sh MANIFEST [--evict N] [--drain-node] [--delete-node]
#                           [--delete-operator-pod] [--upgrade-operator] [--zones N] [--nodes-per-zone N] [--regions N]
#                           [--zone-aware on|off] [--steps N] [--set JQ]... [--namespace NS]
#                           [--timeout SECONDS] [--seed N] [--keep DIR] [--dashboard DIR]
#                           [--image ARCHIVE]... [--host-path DIR]...
#
#   --evict N              evict N running members, one at a time, through the Eviction API
#   --drain-node           kubectl drain a spot node that runs a member
#   --delete-node          a spot node that runs a member dies (its container killed), its Node is
#                          deleted as a cloud's node controller does, and a new spot node joins
#                          its zone as an autoscaler would bring one
#   --delete-operator-pod  kubectl delete the leading operator's pod (its Deployment makes another)
#   --upgrade-operator     helm upgrade of the operator to 2 replicas with a new pod template (a
#                          rolling update); must complete within 120 s, a replica leading after
#   --zones, --nodes-per-zone  the spot nodes, default 2 zones of 2 (each a real node: this
#                          machine's CPUs and memory), beside one on-demand system node
#   --regions N            zone z is in region-((z-1) mod N + 1), default 1 (every node carries
#                          topology.kubernetes.io/region: the job's traffic is priced by it)
#   --zone-aware on|off    set spec.scheduling.zoneAware   } the manifest is applied as it is
#   --steps N              set spec.training.steps        } unless these are given
#   --set JQ               any other change, as a jq update of the object, e.g.
#                          --set '.spec.replicas = {min: 12, target: 20, max: 24}'
#   --keep DIR             copy the logs (pods, nodes, control plane, the watch, the Events) into DIR
#   --dashboard DIR        once a quarter of the steps are done, headless Chromium loads the
#                          operator's dashboard through `murmur dashboard`: its DOM (dom.html)
#                          and a screenshot into DIR
#   --image ARCHIVE        an image of the user's own (an OCI archive) imported into every node
#                          beside murmur's, as a registry would serve it
#   --host-path DIR        a directory of this machine every node holds at the same path,
#                          read-only (data a node's disk holds, for a hostPath volume)
#
# Needs root, podman, mmdebstrap, iproute2, jq, curl, Go (the control plane is built on first
# use) and the binaries: MURMUR_BINARIES, a directory holding murmur and murmur-trainer (default
# target/release: cargo build --release). Progress goes to stderr. Exit 0 when the job succeeded
# and every step of the flow worked, 1 otherwise.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=../support/say.sh
source "$HERE/../support/say.sh"
usage() { sed -n '/^#   e2e/,/^#  *and a screenshot/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
# Before the job is applied a failure is only a message; after it, the final JSON still follows.
APPLIED=0
die() {
    say "$*"
    if ((APPLIED)); then report "$*"; fi
    exit 1
}

MANIFEST='' EVICT=0 DRAIN=0 DELETE_NODE=0 DELETE_OPERATOR=0 UPGRADE_OPERATOR=0 ZONES=2 PER_ZONE=2 REGIONS=1 ZONE_AWARE=''
NS=murmur-e2e TIMEOUT=900 SEED=${RANDOM} KEEP='' SET_STEPS='' DASHBOARD=''
EDITS=() USER_IMAGES=() HOST_PATHS=()
while (($#)); do
    case $1 in
    --evict) EVICT=${2:?--evict N}; shift ;;
    --drain-node) DRAIN=1 ;;
    --delete-node) DELETE_NODE=1 ;;
    --delete-operator-pod) DELETE_OPERATOR=1 ;;
    --upgrade-operator) UPGRADE_OPERATOR=1 ;;
    --zones) ZONES=${2:?--zones N}; shift ;;
    --nodes-per-zone) PER_ZONE=${2:?--nodes-per-zone N}; shift ;;
    --regions) REGIONS=${2:?--regions N}; shift ;;
    --zone-aware) ZONE_AWARE=${2:?--zone-aware on|off}; shift ;;
    --steps) SET_STEPS=${2:?--steps N}; shift ;;
    --set) EDITS+=("${2:?--set JQ}"); shift ;;
    --namespace) NS=${2:?--namespace NS}; shift ;;
    --timeout) TIMEOUT=${2:?--timeout SECONDS}; shift ;;
    --seed) SEED=${2:?--seed N}; shift ;;
    --keep) KEEP=${2:?--keep DIR}; shift ;;
    --dashboard) DASHBOARD=${2:?--dashboard DIR}; shift ;;
    --image) USER_IMAGES+=("${2:?--image ARCHIVE}"); shift ;;
    --host-path) HOST_PATHS+=("${2:?--host-path DIR}"); shift ;;
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
[[ $ZONES =~ ^[1-9][0-9]*$ && $PER_ZONE =~ ^[1-9][0-9]*$ && $REGIONS =~ ^[1-9][0-9]*$ ]] ||
    die "--zones, --nodes-per-zone and --regions: positive counts"
[[ -z $ZONE_AWARE || $ZONE_AWARE == on || $ZONE_AWARE == off ]] || die "--zone-aware $ZONE_AWARE: on or off"
[[ -z $SET_STEPS || $SET_STEPS =~ ^[1-9][0-9]*$ ]] || die "--steps $SET_STEPS: a positive count"
for archive in ${USER_IMAGES[@]+"${USER_IMAGES[@]}"}; do [[ -f $archive ]] || die "--image $archive: no such file"; done
for dir in ${HOST_PATHS[@]+"${HOST_PATHS[@]}"}; do [[ -d $dir && $dir == /* ]] || die "--host-path $dir: not an absolute path to a directory"; done
# nodes.sh mounts them in every node it starts.
MURMUR_NODE_HOST_PATHS=$(IFS=:; echo "${HOST_PATHS[*]}")
export MURMUR_NODE_HOST_PATHS
((EUID == 0)) || die "real nodes need root"
for tool in jq curl podman; do command -v $tool >/dev/null || die "$tool is needed and not on PATH"; done
if [[ -n $DASHBOARD ]]; then
    BROWSER=$(command -v chromium || command -v chromium-browser || command -v google-chrome) ||
        die "--dashboard needs chromium (apt-get install chromium)"
fi
BINARIES=${MURMUR_BINARIES:-$REPO/target/release}
MURMUR=$BINARIES/murmur
[[ -x $MURMUR && -x $BINARIES/murmur-trainer ]] ||
    die "$BINARIES lacks murmur or murmur-trainer: cargo build --release, or set MURMUR_BINARIES"
RANDOM=$SEED

# The manifest is checked by the same rules as murmur run and the API server, before anything starts.
"$MURMUR" validate "$MANIFEST" >&2 || die "$MANIFEST: not a valid job manifest"

# --- the images -----------------------------------------------------------------------------------
# What a user builds and pushes, built from images/ (once per set of binaries), here imported
# into each node instead of pulled.
IMAGE_TAG=e2e
OPERATOR_IMAGE=localhost/murmur-operator:$IMAGE_TAG
TRAINER_IMAGE=localhost/murmur-trainer:$IMAGE_TAG
IMAGES=$("$HERE/images.sh" "$BINARIES") || die "building the images failed"

export MURMUR_CONTROLPLANE_DIR=${MURMUR_CONTROLPLANE_DIR:-$(mktemp -d /tmp/murmur-job.XXXXXX)}
WORK=$MURMUR_CONTROLPLANE_DIR/job
BACKGROUND=()
finish() {
    local code=$?
    for pid in ${BACKGROUND[@]+"${BACKGROUND[@]}"}; do kill "$pid" 2>/dev/null || true; done
    if [[ -n $KEEP && -d $MURMUR_CONTROLPLANE_DIR ]]; then
        mkdir -p "$KEEP"
        cp -r "$MURMUR_CONTROLPLANE_DIR/logs" "$KEEP/controlplane" 2>/dev/null || true
        cp -r "$WORK" "$KEEP/job" 2>/dev/null || true
        for d in "$MURMUR_CONTROLPLANE_DIR"/nodes/*/logs; do
            [[ -d $d ]] && cp -r "$d" "$KEEP/node-$(basename "$(dirname "$d")")"
        done
    fi
    "$HERE/down.sh" || true
    exit "$code"
}
trap finish EXIT
trap 'exit 130' INT TERM

started=$SECONDS
exports=$("$HERE/up.sh" --real-nodes) || die "up.sh failed; its logs are in $MURMUR_CONTROLPLANE_DIR/logs"
eval "$exports"
# shellcheck disable=SC1091
source "$MURMUR_CONTROLPLANE_DIR/env"
mkdir -p "$WORK/logs"
K=$MURMUR_CONTROLPLANE_BIN/kubectl
HELM=$MURMUR_CONTROLPLANE_BIN/helm
now() { date +%s.%N; }
"$HERE/nodes.sh" load "$IMAGES"/murmur-*.tar ${USER_IMAGES[@]+"${USER_IMAGES[@]}"}

# --- the nodes --------------------------------------------------------------------------------------
# One on-demand system node first (the operator and cluster DNS go there, as on a cluster's system
# pool), then the spot nodes, labelled as Karpenter labels them, all at once. Each line of
# nodes-ready.txt: NAME SECONDS from container start to Ready.
SPOT=karpenter.sh/capacity-type
add_node() { # NAME ZONE(zone-Z) CAPACITY
    local region=region-$(((${2#zone-} - 1) % REGIONS + 1))
    "$HERE/nodes.sh" add "$1" --zone "$2" --label "topology.kubernetes.io/region=$region" --label "$SPOT=$3" >>"$WORK/nodes-ready.txt"
}
add_node system-1 zone-1 on-demand || die "the system node did not become Ready"
"$K" -n kube-system rollout status deploy/coredns --timeout=120s >/dev/null || die "cluster DNS did not become ready"
pids=()
for ((z = 1; z <= ZONES; z++)); do
    for ((i = 1; i <= PER_ZONE; i++)); do
        add_node "spot-zone$z-$i" "zone-$z" spot &
        pids+=($!)
    done
done
for pid in "${pids[@]}"; do wait "$pid" || die "a spot node did not become Ready (logs in $MURMUR_CONTROLPLANE_DIR/nodes)"; done
say "$(wc -l <"$WORK/nodes-ready.txt") real nodes Ready in ${ZONES} zones of ${REGIONS} regions: $(awk '{printf "%s %ss  ", $1, $2}' "$WORK/nodes-ready.txt")"

# --- the chart: the operator in the cluster ---------------------------------------------------------
HELM_CACHE_HOME=$WORK/helm HELM_CONFIG_HOME=$WORK/helm HELM_DATA_HOME=$WORK/helm \
    "$HELM" install murmur "$REPO/charts/murmur" --namespace murmur-system --create-namespace \
    --set image.repository="${OPERATOR_IMAGE%:*}" --set image.tag="$IMAGE_TAG" \
    --set trainer.image="$TRAINER_IMAGE" --set logFormat=text \
    --set-string "nodeSelector.karpenter\\.sh/capacity-type=on-demand" >"$WORK/helm.log" ||
    die "helm install failed: $(cat "$WORK/helm.log")"
"$K" -n murmur-system rollout status deploy/murmur-operator --timeout=180s >/dev/null ||
    die "the operator's Deployment did not become available: $("$K" -n murmur-system get pods -o wide 2>&1)"
# Ready replicas may stand by: the Service reaches the one that labels its pod as the leader.
leader_endpoint() {
    "$K" -n murmur-system get endpointslices -l kubernetes.io/service-name=murmur-operator \
        -o jsonpath='{.items[*].endpoints[?(@.conditions.ready==true)].addresses[*]}' 2>/dev/null
}
for _ in $(seq 120); do [[ -n $(leader_endpoint) ]] && break; sleep 0.5; done
[[ -n $(leader_endpoint) ]] ||
    die "no operator replica leads: $("$K" -n murmur-system get pods --show-labels 2>&1)"
# A user who may get every job (the chart's job-viewer role), as a ServiceAccount with a token
# kubeconfig: the status API and dashboard show a caller only the jobs RBAC lets them get.
"$K" -n murmur-system create serviceaccount murmur-watcher >/dev/null
"$K" create clusterrolebinding murmur-watcher --clusterrole=murmur-operator-job-viewer \
    --serviceaccount=murmur-system:murmur-watcher >/dev/null
WATCHER_TOKEN=$("$K" -n murmur-system create token murmur-watcher --duration=2h)
WATCHER_KUBECONFIG=$WORK/kubeconfig-watcher
"$K" config view --raw --minify --flatten -o json |
    jq --arg t "$WATCHER_TOKEN" '.users = [{name: "watcher", user: {token: $t}}] | .contexts[0].context.user = "watcher"' \
        >"$WATCHER_KUBECONFIG"
CA_FILE=$MURMUR_CONTROLPLANE_DIR/pki/ca.crt
# The status API through the API server's service proxy, as that user: the API server takes the
# token for the hop and drops it, so it goes on in X-Murmur-Authorization for the operator.
api() {
    curl -sf --max-time 10 --cacert "$CA_FILE" -H "Authorization: Bearer $WATCHER_TOKEN" \
        -H "X-Murmur-Authorization: Bearer $WATCHER_TOKEN" \
        "$MURMUR_CONTROLPLANE_SERVER/api/v1/namespaces/murmur-system/services/http:murmur-operator:http/proxy$1"
}
say "operator ready in the cluster: $("$K" -n murmur-system get pods -l app.kubernetes.io/component=operator -o jsonpath='{.items[0].metadata.name} on {.items[0].spec.nodeName}')"

# --- the job ---------------------------------------------------------------------------------------
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
# Every pod's events with the moment they arrived: when each was created and when it ran.
"$K" get pods -n "$NS" -w --output-watch-events \
    -o jsonpath='{.type} {.object.metadata.name} {.object.status.phase}{"\n"}' 2>>"$WORK/pod-watch.err" |
    while read -r line; do echo "$(now) $line"; done >"$WORK/pod-events.txt" &
BACKGROUND+=($!)
if [[ -n $ZONE_AWARE$SET_STEPS${EDITS[*]+x} ]]; then
    "$K" apply -n "$NS" -f - <<<"$SPEC" >/dev/null
else
    "$K" apply -n "$NS" -f "$MANIFEST" >/dev/null # exactly the user's file
fi
applied=$(now)
APPLIED=1
say "applied $MANIFEST as $NS/$JOB"
job() { "$K" get dtj "$JOB" -n "$NS" -o json 2>/dev/null; }
# The live step, from the operator's status API (the job's status is refreshed every few seconds).
step() { api "/api/v1/namespaces/$NS/jobs/$JOB" 2>/dev/null | jq -r '.status.progress.step // 0' 2>/dev/null || echo 0; }
"$K" get dtj -n "$NS" -w >"$WORK/watch.log" 2>&1 &
BACKGROUND+=($!)
# Which node and image each attempt of each member ran on, the operator's pods, the nodes (pods
# and nodes are gone when the job is), and every container's log as `kubectl logs -f` streams it.
(
    declare -A following=()
    while :; do
        pods=$("$K" get pods -A -o json 2>/dev/null) || { sleep 1; continue; }
        jq -c --arg ns "$NS" --arg job "$JOB" '.items[] | select(.metadata.namespace == $ns and .metadata.labels["murmur.dev/job"] == $job and .spec.nodeName != null)
            | {member: (.metadata.labels["murmur.dev/member"] | tonumber), attempt: (.metadata.labels["murmur.dev/attempt"] | tonumber),
               pod: .metadata.name, node: .spec.nodeName, podIP: .status.podIP,
               imageID: ((.status.containerStatuses // [])[0].imageID // null | if . == "" then null else . end),
               terminated: ((.status.containerStatuses // [])[0].state.terminated // null
                   | if . then {exitCode, reason, message} else null end)}' \
            <<<"$pods" >>"$WORK/placements.jsonl" || true
        jq -c '.items[] | select(.metadata.namespace == "murmur-system" and .metadata.labels["app.kubernetes.io/component"] == "operator" and .spec.nodeName != null)
            | {pod: .metadata.name, node: .spec.nodeName, imageID: ((.status.containerStatuses // [])[0].imageID // null)}' \
            <<<"$pods" >>"$WORK/operator-pods.jsonl" || true
        while read -r ns pod; do
            [[ -n ${following[$ns/$pod]:-} ]] && continue
            following[$ns/$pod]=1
            "$K" logs -f -n "$ns" "$pod" >"$WORK/logs/$pod.log" 2>&1 &
        done < <(jq -r --arg ns "$NS" '.items[] | select(.metadata.namespace == $ns or .metadata.namespace == "murmur-system")
            | select(((.status.containerStatuses // [])[0].state // {}) | has("running") or has("terminated"))
            | "\(.metadata.namespace) \(.metadata.name)"' <<<"$pods")
        "$K" get nodes -o json 2>/dev/null | jq -c '.items[] | {name: .metadata.name, labels: .metadata.labels,
            containerRuntimeVersion: .status.nodeInfo.containerRuntimeVersion, kubeletVersion: .status.nodeInfo.kubeletVersion}' \
            >>"$WORK/nodes.jsonl" 2>/dev/null || true
        job | jq -c '{t: now, version: .status.topologyVersion, step: .status.progress.step, phase: .status.phase}' \
            >>"$WORK/versions.jsonl" 2>/dev/null || true
        sleep 1
    done
) &
BACKGROUND+=($!)

phase() { job | jq -r '.status.phase // ""'; }
ended() { local p; p=$(phase); [[ $p == Succeeded || $p == Failed ]]; }
# A random running member pod: "pod member node".
# A running member's pod, its member and its node, on none of the nodes this run killed: a pod
# there may still read Running, but the operator deletes it at once.
KILLED_NODES=''
running_member() {
    "$K" get pods -n "$NS" -l "murmur.dev/job=$JOB" --field-selector=status.phase=Running -o json |
        jq -r --arg killed "$KILLED_NODES" '.items[] | select(.metadata.deletionTimestamp == null)
            | select(.spec.nodeName as $n | $killed | split(" ") | any(. == $n) | not)
            | "\(.metadata.name) \(.metadata.labels["murmur.dev/member"]) \(.spec.nodeName)"' |
        shuf -n1 --random-source=<(yes "$RANDOM")
}
record() { # KIND TARGET MEMBER POD AT [SKIPPED] [JSON]: what was done, to whom, when (epoch seconds)
    jq -nc --arg kind "$1" --arg target "$2" --argjson member "$3" --arg pod "$4" --argjson at "$5" --arg skipped "${6:-}" \
        --argjson more "${7:-"{}"}" \
        '{kind: $kind, target: (if $target == "" then null else $target end), member: $member,
          pod: (if $pod == "" then null else $pod end), at: $at}
         + (if $skipped == "" then {} else {skipped: $skipped} end) + $more' >>"$WORK/disruptions.jsonl"
}

# The end, and what the run measured. The last line of stdout, whatever happened; ERROR says
# what went wrong, if anything did.
report() {
    local error=${1:-} p
    p=$(phase || true)
    ended=$(now)
    say "job $NS/$JOB: ${p:-no phase} after $(jq -n "$ended - $applied | floor") s${error:+ ($error)}"
    api "/api/v1/namespaces/$NS/jobs/$JOB" >"$WORK/view.json" 2>/dev/null || echo '{}' >"$WORK/view.json"
    job >"$WORK/job.json" || echo '{}' >"$WORK/job.json"
    # The job's Events (Relocated, Replaced, ...) for --keep: the planner's reasons, which no log
    # line repeats.
    "$K" get events -n "$NS" -o json >"$WORK/events.json" 2>/dev/null || echo '{}' >"$WORK/events.json"
    touch "$WORK"/{disruptions,versions,placements,operator-pods,nodes}.jsonl "$WORK"/{pod-events,exec,nodes-ready}.txt
    # The trainers' own log lines, with the pod each came from: when each adopted a topology,
    # and when each had its first averaging round.
    for f in "$WORK"/logs/"$JOB"-*.log; do
        [[ -f $f ]] || continue
        jq -cR --arg pod "$(basename "$f" .log)" 'fromjson? | select(.fields.message == "following topology" or .fields.message == "first averaging round with peers")
            | {pod: $pod, message: .fields.message, version: .fields.version,
               t: ((.timestamp | sub("\\.[0-9]+Z$"; "Z") | fromdateiso8601) + (.timestamp | capture("(?<f>\\.[0-9]+)Z$").f // "0" | tonumber))}' \
            "$f" 2>/dev/null || true
    done >"$WORK/trainer-events.jsonl"
    # Pod created -> Running, from the watch's arrival times, per pod of the job.
    awk -v job="$JOB-" 'index($3, job) == 1 {
            if ($2 == "ADDED" && !($3 in a)) a[$3] = $1
            if ($4 == "Running" && !($3 in r)) r[$3] = $1
        }
        END { for (p in r) if (p in a) printf "{\"pod\": \"%s\", \"seconds\": %.3f}\n", p, r[p] - a[p] }' \
        "$WORK/pod-events.txt" >"$WORK/pod-start.jsonl"
    # Every pod of the job the watch saw created, placed or not: a replacement lost before the
    # pod poll saw it on a node (its node deleted under it) is one too.
    pods_created=$(awk -v job="$JOB-" 'index($3, job) == 1 && $2 == "ADDED" && !($3 in a) {a[$3] = 1; n++}
        END {print n + 0}' "$WORK/pod-events.txt")
    # The poll above still appends to these and may be mid-line: read their whole lines only.
    for f in nodes placements operator-pods versions; do
        jq -cR 'fromjson? // empty' "$WORK/$f.jsonl" >"$WORK/$f.whole.jsonl" 2>/dev/null || true
    done
    jq -n --slurpfile job "$WORK/job.json" --slurpfile view "$WORK/view.json" \
        --slurpfile nodes "$WORK/nodes.whole.jsonl" --slurpfile placements "$WORK/placements.whole.jsonl" \
        --slurpfile operator "$WORK/operator-pods.whole.jsonl" --slurpfile podstart "$WORK/pod-start.jsonl" \
        --slurpfile disruptions "$WORK/disruptions.jsonl" --slurpfile trainer "$WORK/trainer-events.jsonl" \
        --slurpfile versions "$WORK/versions.whole.jsonl" --rawfile ready "$WORK/nodes-ready.txt" \
        --rawfile exec "$WORK/exec.txt" \
        --slurpfile images "$IMAGES/built.json" --arg error "$error" \
        --argjson applied "$applied" --argjson ended "$ended" --argjson total "$((SECONDS - started))" \
        --argjson podsCreated "$pods_created" '
        ($job[0].status // {}) as $s
        | ($nodes | reverse | unique_by(.name) | map({(.name): .}) | add // {}) as $node
        | ($ready | split("\n") | map(select(. != "") | split(" ") | {(.[0]): (.[1] | tonumber)}) | add // {}) as $readyAt
        | def pct($q): sort | if length == 0 then null else .[((length - 1) * $q | floor)] end;
        {
            job: $job[0].metadata.name, namespace: $job[0].metadata.namespace,
            phase: $s.phase, finalAccuracy: $s.progress.accuracy, step: $s.progress.step,
            preemptions: $s.preemptions, restarts: $s.restarts, relocations: ($s.relocations // 0),
            podsCreated: $podsCreated,
            topologyVersion: $s.topologyVersion,
            jobSeconds: ($ended - $applied), wallSeconds: $total,
            imagesBuildSeconds: $images[0].buildAndSaveSeconds,
            nodes: ($node | to_entries | map(.value + {readySeconds: $readyAt[.key]})),
            podStartSeconds: ([$podstart[].seconds] | {n: length, p50: pct(0.5), p99: pct(0.99), max: max}),
            exec: ($exec | rtrimstr("\n")),
            operator: ($operator | map(select(.imageID != null and .imageID != "")) | unique_by(.pod)),
            # One record per pod: its newest with a termination, else its newest.
            members: ($placements | reverse | map(select(.terminated != null)) + ($placements | reverse)
                | unique_by(.pod) | sort_by(.member, .attempt)
                | map(. + {nodeLabels: ($node[.node].labels // {}),
                           containerRuntimeVersion: $node[.node].containerRuntimeVersion})),
            memberStatus: $s.members, view: $view[0],
            disruptions: ($disruptions | map(. + {atSeconds: (.at - $applied)})),
            # Per member lost: from the API call to the survivors first following a topology
            # without it, and to the first averaging round of its replacement (its next attempt).
            healing: [$disruptions[] | select(.pod != null and .skipped == null) | . as $d
                | ($d.pod | capture("^(?<base>.*)-(?<attempt>[0-9]+)$")) as $p
                | "\($p.base)-\($p.attempt | tonumber + 1)" as $replacement
                | {kind: $d.kind, member: $d.member, pod: $d.pod, replacement: $replacement,
                   survivorsSeconds: ([$trainer[] | select(.message == "following topology" and .t > $d.at and (.pod | startswith("\($p.base)-") | not)) | .t] | min | if . then . - $d.at else null end),
                   replacementSeconds: ([$trainer[] | select(.message == "first averaging round with peers" and .pod == $replacement) | .t] | min | if . then . - $d.at else null end)}],
            versionsMonotonic: ([$versions[] | .version // 0] | . as $v | [range(1; length)] | all($v[.] >= $v[. - 1])),
            stepsMonotonic: ([$versions[] | .step // 0] | . as $v | [range(1; length)] | all($v[.] >= $v[. - 1]))
        } + (if $error == "" then {} else {error: $error} end)' >"$WORK/result.json"
    jq -c 'del(.view)' "$WORK/result.json"
}

# kubectl exec into a member, as a user debugging one would: its trainer (the container's first
# process, whatever the image calls it) says its version.
: >"$WORK/exec.txt"
for _ in $(seq 1 120); do
    if read -r pod _ _ < <(running_member); then
        "$K" exec -n "$NS" "$pod" -c trainer -- /proc/1/exe --version >"$WORK/exec.txt" 2>&1 && break
        say "kubectl exec into $pod failed: $(cat "$WORK/exec.txt")"
        # Its member was relocated or replaced meanwhile, its pod going: another one is tried.
        going=$("$K" get pod -n "$NS" "$pod" -o jsonpath='{.metadata.deletionTimestamp}' 2>/dev/null || echo gone)
        [[ -n $going ]] || break
    fi
    ended && break
    sleep 0.5
done

# The disruptions, each at a random step between 15% and 65% of the run, in order. One that
# cannot happen (the job ended first, or no member runs) is recorded as skipped, with why.
plan=()
for ((i = 0; i < EVICT; i++)); do plan+=(evict); done
((DRAIN)) && plan+=(drain)
((DELETE_NODE)) && plan+=(delete-node)
((DELETE_OPERATOR)) && plan+=(delete-operator-pod)
((UPGRADE_OPERATOR)) && plan+=(upgrade-operator)
at=()
if ((${#plan[@]})); then
    mapfile -t plan < <(printf '%s\n' "${plan[@]}" | shuf --random-source=<(yes "$RANDOM"))
    for ((i = 0; i < ${#plan[@]}; i++)); do
        at+=($((STEPS * (15 + RANDOM % 50) / 100)))
    done
    mapfile -t at < <(printf '%s\n' "${at[@]}" | sort -n)
fi
deadline=$((SECONDS + TIMEOUT))
replacements=0
for ((i = 0; i < ${#plan[@]}; i++)); do
    kind=${plan[$i]}
    skipped=
    until (($(step) >= at[i])); do
        if ended; then skipped="the job had ended ($(phase)) before step ${at[$i]}"; break; fi
        ((SECONDS < deadline)) || die "timed out waiting for step ${at[$i]}"
        sleep 0.5
    done
    if [[ -z $skipped && $kind != *-operator* ]] && ! read -r pod member node < <(running_member); then
        skipped="no member was running at step $(step)"
    fi
    if [[ -n $skipped ]]; then
        say "$kind skipped: $skipped"
        record "$kind" "" null "" "$(now)" "$skipped"
        continue
    fi
    case $kind in
    evict)
        say "step $(step): evicting $pod (member $member, on $node)"
        record evict "$pod" "$member" "$pod" "$(now)"
        "$K" create --raw "/api/v1/namespaces/$NS/pods/$pod/eviction" -f - >/dev/null <<EOF
{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "$pod", "namespace": "$NS"}}
EOF
        ;;
    drain)
        say "step $(step): draining $node (member $member)"
        record drain "$node" "$member" "$pod" "$(now)"
        "$K" drain "$node" --ignore-daemonsets --delete-emptydir-data --force --timeout=120s >>"$WORK/drain.log" 2>&1 ||
            die "kubectl drain $node failed: $(tail -3 "$WORK/drain.log")"
        ;;
    delete-node)
        say "step $(step): node $node dies (member $member), its Node is deleted, a new spot node joins"
        record delete-node "$node" "$member" "$pod" "$(now)"
        "$HERE/nodes.sh" kill "$node"
        KILLED_NODES+=" $node"
        "$K" delete node "$node" --wait=false >/dev/null
        replacements=$((replacements + 1))
        zone=$(jq -cR 'fromjson? // empty' "$WORK/nodes.jsonl" |
            jq -r --arg n "$node" 'select(.name == $n) | .labels["topology.kubernetes.io/zone"]' | tail -1)
        add_node "spot-${zone:-zone-1}-r$replacements" "${zone:-zone-1}" spot &
        BACKGROUND+=($!)
        ;;
    delete-operator-pod)
        # The leader's (the one the Service reaches), when one is labelled.
        operator_pod=$("$K" -n murmur-system get pods -l murmur.dev/operator-leader=true -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
        [[ -n $operator_pod ]] ||
            operator_pod=$("$K" -n murmur-system get pods -l app.kubernetes.io/component=operator -o jsonpath='{.items[0].metadata.name}')
        say "step $(step): deleting the operator's pod $operator_pod (the leader)"
        record delete-operator-pod "$operator_pod" null "" "$(now)"
        "$K" -n murmur-system delete pod "$operator_pod" --wait=false >/dev/null
        ;;
    upgrade-operator)
        say "step $(step): helm upgrade of the operator (2 replicas, a new pod template)"
        began=$(now)
        HELM_CACHE_HOME=$WORK/helm HELM_CONFIG_HOME=$WORK/helm HELM_DATA_HOME=$WORK/helm \
            "$HELM" upgrade murmur "$REPO/charts/murmur" --namespace murmur-system --reuse-values \
            --set replicaCount=2 --set-string "podAnnotations.murmur\\.dev/upgraded=$began" \
            >>"$WORK/helm.log" 2>&1 || die "helm upgrade failed: $(tail -3 "$WORK/helm.log")"
        "$K" -n murmur-system rollout status deploy/murmur-operator --timeout=120s >>"$WORK/helm.log" 2>&1 ||
            die "the operator's rolling update did not complete: $("$K" -n murmur-system get pods -o wide 2>&1)"
        rolled=$(now)
        for _ in $(seq 120); do [[ -n $(leader_endpoint) ]] && break; sleep 0.5; done
        leaders=$("$K" -n murmur-system get pods -l murmur.dev/operator-leader=true -o jsonpath='{.items[*].metadata.name}')
        [[ $(wc -w <<<"$leaders") == 1 ]] || die "after the upgrade, leaders: '$leaders'"
        say "step $(step): upgrade rolled out in $(jq -n "$rolled - $began | . * 10 | round / 10") s; $leaders leads"
        record upgrade-operator "$leaders" null "" "$began" "" \
            "$(jq -nc --argjson r "$(jq -n "$rolled - $began")" --argjson l "$(jq -n "$(now) - $began")" '{rolloutSeconds: $r, leaderSeconds: $l}')"
        ;;
    esac
done

# --- the dashboard, as a user opens it mid-run: `murmur dashboard` with their kubeconfig ------------
if [[ -n $DASHBOARD ]]; then
    until (($(step) >= STEPS / 4)); do
        ended && die "the job ended ($(phase)) before the dashboard was looked at"
        ((SECONDS < deadline)) || die "timed out waiting for step $((STEPS / 4))"
        sleep 0.5
    done
    mkdir -p "$DASHBOARD"
    # There before the loop below reads it: a read of a missing file fails the pipeline, and
    # with errexit the whole script, if the background job has not opened it yet.
    : >"$WORK/dashboard.log"
    "$MURMUR" dashboard --kubeconfig "$WATCHER_KUBECONFIG" --no-browser -n "$NS" "$JOB" >"$WORK/dashboard.log" 2>&1 &
    forward=$!
    BACKGROUND+=("$forward")
    for _ in $(seq 1 100); do
        url=$(sed -n 's/^dashboard: //p' "$WORK/dashboard.log" | head -1)
        [[ -n $url ]] && break
        sleep 0.1
    done
    [[ -n $url ]] || die "murmur dashboard did not start: $(cat "$WORK/dashboard.log")"
    # shellcheck disable=SC2054 # the commas are in --window-size's value
    chrome=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars
        --disable-background-networking --disable-component-update --disable-sync --no-first-run
        --window-size=1400,1000 --virtual-time-budget=4000)
    "$BROWSER" "${chrome[@]}" --dump-dom "$url" >"$DASHBOARD/dom.html" 2>>"$WORK/chromium.log"
    "$BROWSER" "${chrome[@]}" --screenshot="$DASHBOARD/dashboard.png" "$url" >>"$WORK/chromium.log" 2>&1
    kill "$forward" 2>/dev/null || true
    say "step $(step): the operator's dashboard captured in $DASHBOARD (murmur dashboard, as a job viewer)"
fi

# --- the end ---------------------------------------------------------------------------------------
until ended; do
    ((SECONDS < deadline)) || die "the job did not end within ${TIMEOUT}s (phase $(phase))"
    sleep 1
done
# The trainers' last lines reach their log streams.
sleep 2
report
[[ $(phase) == Succeeded ]]
