#!/usr/bin/env bash
# The project's images for the real nodes of the end-to-end tests, built by images/build.sh from
# the given binaries on the Debian base made here, and saved as OCI archives for the nodes to
# import (nodes.sh load): what a user builds and pushes. Built once per set of binaries and
# image files (a cache under target/e2e-images/); prints the directory holding the archives.
#
#   e2e/controlplane/images.sh BINARIES     # a directory holding murmur and murmur-trainer
#
# The images are localhost/murmur-operator:e2e and localhost/murmur-trainer:e2e, and the runtime
# base they are built on, localhost/murmur-runtime-base:bookworm (an image without the trainer:
# what a container whose command cannot start looks like). built.json says how long the build
# and save took.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BINARIES=${1:?usage: e2e/controlplane/images.sh BINARIES}
# shellcheck source=../support/say.sh
source "$HERE/../support/say.sh"

for b in murmur murmur-trainer; do
    [[ -x $BINARIES/$b ]] || { say "$BINARIES/$b is missing"; exit 1; }
done
key=$({ stat -L -c '%n %s %Y' "$BINARIES/murmur" "$BINARIES/murmur-trainer"; cat "$REPO"/images/*; } | sha256sum | cut -c1-16)
out=$REPO/target/e2e-images/$key
if [[ ! -f $out/built.json ]]; then
    # One set at a time: an older one is of no use once the binaries changed.
    rm -rf "$REPO/target/e2e-images"
    mkdir -p "$out"
    started=$(date +%s.%N)
    "$REPO/images/build.sh" --binaries "$BINARIES" --local-base --repository localhost --tag e2e \
        --save "$out" >/dev/null
    base=localhost/murmur-runtime-base:bookworm
    CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/node/containers.conf} \
        podman save --quiet --format oci-archive -o "$out/runtime-base.tar" "$base"
    seconds=$(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')
    echo "{\"buildAndSaveSeconds\": $seconds}" >"$out/built.json"
    say "images built and saved in $seconds s"
fi
echo "$out"
