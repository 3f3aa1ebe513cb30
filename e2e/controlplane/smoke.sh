#!/usr/bin/env bash
# A smoke test of up.sh/down.sh, and the place to see how a test drives the control plane:
# starts an instance in its own state dir, makes a fake node and a pod, evicts the pod through
# the Eviction API, renders a chart with helm, and checks that down.sh leaves nothing behind.
# Prints timings and the resident memory of each component. Takes about half a minute once the
# binaries are built.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export MURMUR_CONTROLPLANE_DIR=${MURMUR_CONTROLPLANE_DIR:-$(mktemp -u /tmp/murmur-controlplane-smoke.XXXXXX)}
work=$(mktemp -d)
passed=0
failed=0
check() { # DESCRIPTION COMMAND...: runs the command, counts and reports the outcome
    local what=$1
    shift
    if "$@"; then
        echo "ok: $what"
        passed=$((passed + 1))
    else
        echo "FAILED: $what"
        failed=$((failed + 1))
    fi
}
cleanup() {
    "$HERE/down.sh" || true
    rm -rf "$work"
}
trap cleanup EXIT

"$HERE/build.sh"
t0=$(date +%s.%N)
"$HERE/up.sh" >"$work/up.out"
echo "up.sh: $(echo "$(date +%s.%N) - $t0" | bc) s to the export line"
check "the last line of up.sh is the KUBECONFIG export" \
    grep -q "^export KUBECONFIG=$MURMUR_CONTROLPLANE_DIR/kubeconfig\$" <(tail -n 1 "$work/up.out")
eval "$(cat "$work/up.out")"
PATH=$MURMUR_CONTROLPLANE_BIN:$PATH

echo "resident memory after start (ps -o rss, KiB):"
for name in etcd kube-apiserver kube-controller-manager kube-scheduler kwok; do
    printf '  %-24s %s\n' "$name" "$(ps -o rss= -p "$(cat "$MURMUR_CONTROLPLANE_DIR/pids/$name.pid")")"
done

check "/readyz" test "$(kubectl get --raw /readyz)" = ok
check "a second up.sh on the same state dir refuses" \
    bash -c '! "$1/up.sh" >/dev/null 2>"$2/up2.err"' _ "$HERE" "$work"
grep -q "already running" "$work/up2.err" || { echo "unexpected: $(cat "$work/up2.err")"; failed=$((failed + 1)); }

kubectl create namespace t >/dev/null
# A fake node: kwok manages it because of the annotation (and so plays its kubelet).
kubectl apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: fake-1
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: fake-1
---
apiVersion: v1
kind: Pod
metadata:
  name: p1
  namespace: t
spec:
  containers:
  - name: c
    image: example.invalid/trainer:1
EOF
t0=$(date +%s.%N)
for _ in $(seq 1 150); do
    state=$(kubectl get pod -n t p1 -o jsonpath='{.status.phase} {.spec.nodeName} {.status.podIP}')
    [[ $state == Running* ]] && break
    sleep 0.2
done
echo "pod p1: '$state' $(echo "$(date +%s.%N) - $t0" | bc) s after creation"
check "the scheduler bound the pod to the fake node and kwok ran it" test "${state% *}" = "Running fake-1"
check "ServiceAccount default exists in t" kubectl get sa default -n t -o name

# Evict through the Eviction API, as the operator or kubectl drain would, watching the pod to
# see the condition the API server adds before the pod goes away.
kubectl get pod -n t p1 -w --output-watch-events \
    -o jsonpath='{.type} {.object.status.conditions[?(@.type=="DisruptionTarget")].reason}{"\n"}' \
    >"$work/watch" 2>&1 &
watcher=$!
sleep 1
kubectl create --raw /api/v1/namespaces/t/pods/p1/eviction -f - >/dev/null <<'EOF'
{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p1", "namespace": "t"}}
EOF
for _ in $(seq 1 100); do
    kubectl get pod -n t p1 >/dev/null 2>&1 || break
    sleep 0.2
done
sleep 0.5
kill "$watcher" 2>/dev/null || true
wait "$watcher" 2>/dev/null || true
echo "pod p1 watch during eviction:"
sed 's/^/  /' "$work/watch"
check "the evicted pod got DisruptionTarget EvictionByEvictionAPI and was deleted" \
    bash -c 'grep -q "EvictionByEvictionAPI" "$1" && grep -q "^DELETED" "$1"' _ "$work/watch"

check "helm version" helm version --short
mkdir -p "$work/chart/templates"
printf 'apiVersion: v2\nname: tiny\nversion: 0.1.0\nkubeVersion: ">=1.30.0-0"\n' >"$work/chart/Chart.yaml"
printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: tiny\ndata:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n' \
    >"$work/chart/templates/cm.yaml"
check "helm template of a tiny chart" bash -c 'helm template tiny "$1" | grep -q "kind: ConfigMap"' _ "$work/chart"

pids=$(cat "$MURMUR_CONTROLPLANE_DIR"/pids/*.pid)
t0=$(date +%s.%N)
"$HERE/down.sh"
echo "down.sh: $(echo "$(date +%s.%N) - $t0" | bc) s"
# A process that has exited but is not reaped yet (a zombie) has an empty command line.
check "down.sh left no process" bash -c 'for p in $1; do [[ -z $(tr -d "\0" 2>/dev/null </proc/$p/cmdline) ]] || exit 1; done' _ "$pids"
check "down.sh removed the state dir" test ! -e "$MURMUR_CONTROLPLANE_DIR"
check "down.sh a second time is fine" "$HERE/down.sh"

echo "$passed passed, $failed failed"
((failed == 0))
