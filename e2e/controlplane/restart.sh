#!/usr/bin/env bash
# Kills components of the control plane in $MURMUR_CONTROLPLANE_DIR with SIGKILL, as a crash or an
# OOM kill would, waits, and starts them again with the command lines up.sh ran them with, on
# the same data (etcd keeps its data dir; the API server its certificates and keys).
#
#   e2e/controlplane/restart.sh [--down-for SECONDS] NAME...   (e.g. etcd kube-apiserver)
#
# Prints how long each component took to answer again. Exit 1 if one does not.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

DOWN_FOR=0
NAMES=()
while (($#)); do
    case $1 in
    --down-for) DOWN_FOR=${2:?--down-for SECONDS}; shift ;;
    -*) die "unknown flag $1" ;;
    *) NAMES+=("$1") ;;
    esac
    shift
done
((${#NAMES[@]})) || die "name the components to restart (etcd, kube-apiserver, ...)"
[[ -e $DIR/$MARKER ]] || die "$DIR is not a control plane state dir"

for name in "${NAMES[@]}"; do
    [[ -f $DIR/commands/$name ]] || die "no command line recorded for $name in $DIR/commands"
    if pid=$(our_pid "$name"); then
        kill -KILL "$pid"
        while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
        say "$name (pid $pid) killed"
    fi
done
sleep "$DOWN_FOR"
for name in "${NAMES[@]}"; do
    # The command line was written with printf %q: eval reads it back word for word.
    eval "set -- $(<"$DIR/commands/$name")"
    setsid "$@" </dev/null >>"$DIR/logs/$name.log" 2>&1 9>&- &
    echo $! >"$DIR/pids/$name.pid"
done
SERVER=$(sed -n 's/^ *server: //p' "$DIR/kubeconfig" | head -1)
began=$SECONDS
until curl -sf --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "$SERVER/readyz" >/dev/null 2>&1; do
    ((SECONDS - began < 120)) || die "the API server did not answer /readyz within 120 s"
    for name in "${NAMES[@]}"; do
        our_pid "$name" >/dev/null || die "$name exited again: $(tail -5 "$DIR/logs/$name.log")"
    done
    sleep 0.2
done
say "${NAMES[*]} back; the API server ready $((SECONDS - began)) s after the start"
