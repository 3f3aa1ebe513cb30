#!/usr/bin/env bash
# Prints manifests/install.yaml: the murmur-system Namespace, then `helm template` of the chart
# with default values and its CRDs, so that `kubectl apply -f manifests/install.yaml` installs
# what `helm install murmur charts/murmur -n murmur-system` does. helm comes from
# e2e/controlplane (built from its Go module if missing).
#
#   charts/install-manifest.sh > manifests/install.yaml
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${MURMUR_CONTROLPLANE_BIN:-$ROOT/e2e/controlplane/.bin}
MURMUR_CONTROLPLANE_BIN=$BIN "$ROOT/e2e/controlplane/build.sh"
cat <<'HEAD'
# Generated from charts/murmur with default values (release murmur, namespace murmur-system):
#   charts/install-manifest.sh > manifests/install.yaml
# Do not edit by hand; CI checks it is up to date.
---
apiVersion: v1
kind: Namespace
metadata:
  name: murmur-system
HEAD
cd "$ROOT"
"$BIN/helm" template murmur charts/murmur --namespace murmur-system --include-crds
