#!/usr/bin/env bash
# The cluster e2e: install the chart into a kind (or k3d) cluster, label the nodes as spot, run the
# D-Cliques example, delete one member and evict another mid-run, and require that the job succeeds
# with both counted as preemptions (not failures).
#
#   e2e/cluster/run.sh                 # kind: creates cluster `murmur-e2e`, deletes it at the end
#   MURMUR_E2E_CLUSTER=k3d e2e/cluster/run.sh
#   MURMUR_E2E_KEEP=1 e2e/cluster/run.sh   # keep the cluster to look around
#
# Needs docker (with a running engine), kind or k3d, helm and kubectl on PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."

PROVIDER="${MURMUR_E2E_CLUSTER:-kind}"
NAME="${MURMUR_E2E_NAME:-murmur-e2e}"
NAMESPACE=murmur-e2e
JOB=mnist-dcliques
TAG=e2e
TIMEOUT_S="${MURMUR_E2E_TIMEOUT_S:-1800}"

say() { printf '::: %s\n' "$*"; }

# Every missing prerequisite at once, each with what to do about it.
check_prerequisites() {
    local missing=()
    case "$PROVIDER" in
        kind | k3d) ;;
        *) echo "MURMUR_E2E_CLUSTER must be kind or k3d, not '$PROVIDER'" >&2; exit 2 ;;
    esac
    command -v "$PROVIDER" >/dev/null 2>&1 ||
        missing+=("$PROVIDER: https://kind.sigs.k8s.io/docs/user/quick-start/#installation (or k3d.io with MURMUR_E2E_CLUSTER=k3d)")
    command -v helm >/dev/null 2>&1 || missing+=("helm: https://helm.sh/docs/intro/install/")
    command -v kubectl >/dev/null 2>&1 || missing+=("kubectl: https://kubernetes.io/docs/tasks/tools/")
    if ! command -v docker >/dev/null 2>&1; then
        missing+=("docker: https://docs.docker.com/engine/install/ (images are built and loaded into the cluster)")
    elif ! docker info >/dev/null 2>&1; then
        missing+=("a running Docker engine: 'docker info' fails (start dockerd, or check permissions on its socket)")
    fi
    if ((${#missing[@]})); then
        echo "the cluster e2e cannot run; missing:" >&2
        printf '  - %s\n' "${missing[@]}" >&2
        exit 3
    fi
}

dump() {
    say "state at failure"
    kubectl get dtj -A -o wide || true
    kubectl -n "$NAMESPACE" get dtj "$JOB" -o yaml || true
    kubectl -n "$NAMESPACE" get pods -o wide || true
    kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp | tail -50 || true
    kubectl -n murmur-system logs deploy/murmur-operator --tail=200 || true
}

cleanup() {
    local rc=$?
    ((rc == 0)) || dump
    if [[ "${MURMUR_E2E_KEEP:-}" != 1 ]]; then
        say "deleting cluster $NAME"
        if [[ "$PROVIDER" == kind ]]; then kind delete cluster --name "$NAME" >/dev/null 2>&1 || true
        else k3d cluster delete "$NAME" >/dev/null 2>&1 || true; fi
    fi
    exit "$rc"
}

status() { kubectl -n "$NAMESPACE" get dtj "$JOB" -o "jsonpath={$1}"; }

# Wait until `status <path>` satisfies the shell test in $2 (e.g. '-ge 50'), or fail.
wait_for() {
    local path=$1 test=$2 what=$3 deadline=$((SECONDS + TIMEOUT_S)) value
    while ((SECONDS < deadline)); do
        value=$(status "$path" 2>/dev/null || true)
        if [[ -n "$value" ]] && eval "[[ \"$value\" $test ]]"; then return 0; fi
        if [[ "$(status .status.phase 2>/dev/null || true)" == Failed ]]; then
            echo "the job failed while waiting for $what" >&2
            return 1
        fi
        sleep 5
    done
    echo "timed out after ${TIMEOUT_S}s waiting for $what (last: '$value')" >&2
    return 1
}

check_prerequisites
trap cleanup EXIT

say "cluster: $PROVIDER $NAME"
if [[ "$PROVIDER" == kind ]]; then
    kind get clusters 2>/dev/null | grep -qx "$NAME" ||
        kind create cluster --name "$NAME" --config e2e/cluster/kind.yaml --wait 120s
else
    k3d cluster list "$NAME" >/dev/null 2>&1 || k3d cluster create "$NAME" --agents 3 --wait
fi

say "spot labels on the workers"
for node in $(kubectl get nodes -o name -l '!node-role.kubernetes.io/control-plane'); do
    kubectl label --overwrite "$node" cloud.google.com/gke-spot=true
done

say "images"
docker build -f images/operator.Dockerfile -t "murmur-operator:$TAG" .
docker build -f images/trainer.Dockerfile --target cpu -t "murmur-trainer:$TAG" .
for image in "murmur-operator:$TAG" "murmur-trainer:$TAG"; do
    if [[ "$PROVIDER" == kind ]]; then kind load docker-image "$image" --name "$NAME"
    else k3d image import "$image" --cluster "$NAME"; fi
done

say "helm install"
helm upgrade --install murmur charts/murmur --namespace murmur-system --create-namespace \
    --set image.repository=murmur-operator --set "image.tag=$TAG" --set image.pullPolicy=Never \
    --set "trainer.image=murmur-trainer:$TAG" --wait --timeout 5m

say "the D-Cliques example"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$NAMESPACE" apply -f manifests/examples/dcliques-spot-cpu.yaml
wait_for .status.phase "== Running" "the job to run"
wait_for .status.progress.step "-ge 60" "step 60"

say "delete a member's pod (a reclaimed node)"
victim=$(kubectl -n "$NAMESPACE" get pods -l "murmur.dev/job=$JOB,murmur.dev/member=1" \
    --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}')
kubectl -n "$NAMESPACE" delete pod "$victim" --wait=false
wait_for .status.preemptions "-ge 1" "the deletion to count as a preemption"

say "evict another member (the eviction API, as a node drain or the autoscaler would)"
victim=$(kubectl -n "$NAMESPACE" get pods -l "murmur.dev/job=$JOB,murmur.dev/member=4" \
    --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}')
kubectl create --raw "/api/v1/namespaces/$NAMESPACE/pods/$victim/eviction" -f - <<JSON
{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "$victim", "namespace": "$NAMESPACE"}}
JSON
wait_for .status.preemptions "-ge 2" "the eviction to count as a preemption"

say "until the job succeeds"
wait_for .status.phase "== Succeeded" "the job to succeed"
preemptions=$(status .status.preemptions)
restarts=$(status .status.restarts)
accuracy=$(status .status.progress.accuracy)
say "succeeded: preemptions=$preemptions restarts=$restarts accuracy=$accuracy"
if ((preemptions < 2)); then echo "expected at least 2 preemptions, status says $preemptions" >&2; exit 1; fi
if ((${restarts:-0} != 0)); then echo "preemptions were counted as restarts: $restarts" >&2; exit 1; fi
kubectl -n "$NAMESPACE" get events --field-selector "involvedObject.name=$JOB" | grep -q Preempted ||
    { echo "no Preempted event for $JOB" >&2; exit 1; }
say "cluster e2e passed"
