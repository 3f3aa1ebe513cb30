#!/usr/bin/env bash
# Stops the control plane that up.sh started in $MURMUR_CONTROLPLANE_DIR (default
# /tmp/murmur-controlplane) and removes the state dir with all its data. Only the processes
# recorded in its pid files, and still carrying the state dir on their command line, are
# signalled: TERM, then KILL after $MURMUR_CONTROLPLANE_STOP_GRACE seconds (default 10).
# Safe to run twice, or with nothing running.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

if [[ ! -d $DIR ]]; then
    exit 0
fi
if [[ ! -e $DIR/$MARKER ]]; then
    echo "down.sh: $DIR is not a control plane state dir; leaving it alone" >&2
    exit 1
fi
# Wait for an up.sh still at work on this dir (it gives up within its timeouts) rather than
# pulling the dir from under it.
exec 9>>"$DIR/.lock"
flock -w 600 9 || { echo "down.sh: $DIR stays locked by another up.sh or down.sh" >&2; exit 1; }
stop_all
rm -rf "$DIR"
