#!/usr/bin/env bash
# Builds the control plane binaries into $MURMUR_CONTROLPLANE_BIN (default: .bin/ beside this
# script) from the pinned modules in go.mod/go.sum, unless they are there already and were built
# from the same go.mod, go.sum, *.go and Go version. up.sh runs this first; run it alone to
# build ahead of time (CI can cache the Go module and build caches to make it a relink).
#
# Three binaries come out, plus symlinks:
#   controlplane  multi-call: kube-apiserver, kube-controller-manager, kube-scheduler, etcd,
#                 kubectl, kwok, and the real nodes' kubelet and kube-proxy (and kwok-stages,
#                 which prints kwok's default Stage objects)
#   helm          helm.sh/helm/v3/cmd/helm, built as a tool of this module (helm v3 keeps its
#                 command in package main, so it cannot join the multi-call binary)
#   coredns       the real nodes' cluster DNS, from coredns/: a module of its own, so that
#                 CoreDNS's newer grpc and prometheus never move the Kubernetes pins
#   kueue         Kueue's controller manager (sigs.k8s.io/kueue/cmd/kueue), from kueue/: a module
#                 of its own for the same reason; kueue.sh runs it against a control plane
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${MURMUR_CONTROLPLANE_BIN:-$HERE/.bin}
COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy etcd kubectl kwok)

command -v go >/dev/null || { echo "build.sh: go is not on PATH" >&2; exit 1; }

# The stamp says what the binaries were built from; a change to any of these rebuilds them.
stamp=$(cd "$HERE" && { cat go.mod go.sum ./*.go coredns/go.mod coredns/go.sum coredns/*.go kueue/go.mod kueue/go.sum build.sh; go env GOVERSION GOOS GOARCH; } | sha256sum | cut -d' ' -f1)
if [[ -x $BIN/controlplane && -x $BIN/helm && -x $BIN/coredns && -x $BIN/kueue && -f $BIN/.stamp && $(cat "$BIN/.stamp") == "$stamp" ]]; then
    exit 0
fi

# Versions for the version strings, read from go.mod so that they never disagree with the build.
modver() { awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$HERE/go.mod"; }
kube=$(modver k8s.io/kubernetes)     # v1.37.2
helm=$(modver helm.sh/helm/v3)       # v3.22.0
kueue=$(awk '$1 == "sigs.k8s.io/kueue" { print $2; exit }' "$HERE/kueue/go.mod")
kube_minor=$(cut -d. -f2 <<<"$kube") # 37

# A module build leaves the Kubernetes version at "v0.0.0-master", which kubectl version, helm's
# kubeVersion checks and .Capabilities.KubeVersion would see; set it as the upstream release
# scripts do (hack/lib/version.sh, helm's Makefile). -s -w drops the symbol table and DWARF:
# smaller binaries and a faster link. -X of a package a binary does not link is ignored.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$kube -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor -X $pkg.gitTreeState=clean"
done
ldflags+=" -X helm.sh/helm/v3/internal/version.version=$helm"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kube_minor"
done

echo "build.sh: building the control plane into $BIN (minutes when the Go build cache is cold)" >&2
mkdir -p "$BIN"
start=$SECONDS
# sum.golang.org may be unreachable; go.sum pins every module hash, so checking against the
# checksum database adds nothing here. -mod=readonly: never rewrite go.mod/go.sum while building.
# -trimpath: no local paths in the binaries, so the build cache is shared between checkouts.
export GOSUMDB=off GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=local
(cd "$HERE" && go build -trimpath -ldflags="$ldflags" -o "$BIN/" . tool)
# Static: it runs in a FROM-scratch image on the nodes.
(cd "$HERE/coredns" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$BIN/coredns" .)
(cd "$HERE/kueue" && go build -trimpath -ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue" -o "$BIN/" tool)
# go build names the multi-call binary after the last element of the module path, controlplane.
for c in "${COMMANDS[@]}"; do
    ln -sfn controlplane "$BIN/$c"
done
echo "$stamp" >"$BIN/.stamp"
echo "build.sh: built in $((SECONDS - start))s" >&2
