#!/usr/bin/env bash
# What one server-side apply of a large job status costs the API server: a job is created under
# the given CRD, then its status is applied 15 times with N members (capped at LISTED, default
# 100, as the operator caps status.members: STATUS_MEMBERS_MAX), each with new steps, as the
# operator's progress writes are. Prints the median and the slowest apply, and the stored
# object's managedFields size.
#
#   KUBECONFIG=... [LISTED=N] e2e/scale/status-apply.sh [CRD_FILE] [MEMBERS]
#
# CRD_FILE defaults to the repository's CRD; pass an older one for a before/after figure.
# Needs kubectl (e2e/controlplane/.bin), curl, jq, python3, and a control plane
# (e2e/controlplane/up.sh); the job ssa-bench in namespace default is replaced.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CRD=${1:-$HERE/../../crds/decentralizedtrainingjobs.murmur.dev.yaml}
MEMBERS=${2:-1000}
LISTED=${LISTED:-100}
ROUNDS=15
WORK=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

kubectl apply --server-side --force-conflicts -f "$CRD" >/dev/null
kubectl wait --for=condition=Established crd/decentralizedtrainingjobs.murmur.dev >/dev/null
kubectl delete dtj ssa-bench --ignore-not-found >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: murmur.dev/v1alpha1
kind: DecentralizedTrainingJob
metadata: {name: ssa-bench, namespace: default}
spec:
  replicas: {min: 1, target: $MEMBERS, max: $MEMBERS}
  training: {model: mlp, steps: 100}
EOF
kubectl proxy --port="$PORT" >/dev/null 2>&1 &
PROXY=$!
trap 'kill $PROXY; rm -rf "$WORK"' EXIT
until curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null; do sleep 0.2; done

URL="http://127.0.0.1:$PORT/apis/murmur.dev/v1alpha1/namespaces/default/decentralizedtrainingjobs/ssa-bench/status?fieldManager=status-apply&force=true"
for round in $(seq 1 "$ROUNDS"); do
    python3 - "$MEMBERS" "$round" "$LISTED" >"$WORK/status.json" <<'EOF'
import json, sys
n, r, listed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
members = [{"id": i, "pod": f"ssa-bench-{i}-0", "node": f"node-{i % 100}", "phase": "Training",
            "step": r * 10 + i % 7, "joinedAt": "2026-11-26T10:00:00Z", "zone": f"zone-{i % 3}"}
           for i in range(min(n, listed))]
print(json.dumps({"apiVersion": "murmur.dev/v1alpha1", "kind": "DecentralizedTrainingJob",
                  "status": {"phase": "Running", "members": members,
                             "memberSummary": f"{n}/{n}", "topologyVersion": r}}))
EOF
    curl -s -o "$WORK/answer.json" -w '%{time_total}\n' -X PATCH \
        -H 'Content-Type: application/apply-patch+yaml' --data-binary "@$WORK/status.json" \
        "$URL" >>"$WORK/times"
    jq -e '.status.members | length > 0' "$WORK/answer.json" >/dev/null ||
        { echo "status-apply: the apply was refused: $(head -c 600 "$WORK/answer.json")" >&2; exit 1; }
done
MANAGED=$(kubectl get dtj ssa-bench -o json --show-managed-fields | jq -c .metadata.managedFields | wc -c)
sort -n "$WORK/times" | awk -v members="$MEMBERS" -v listed="$((MEMBERS < LISTED ? MEMBERS : LISTED))" -v managed="$MANAGED" '
    { t[NR] = $1 * 1000 }
    END { printf "{\"members\":%d,\"listed\":%d,\"applyMedianMs\":%.1f,\"applyMaxMs\":%.1f,\"managedFieldsBytes\":%d}\n",
                 members, listed, t[int((NR + 1) / 2)], t[NR], managed }'
