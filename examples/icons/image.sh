#!/usr/bin/env bash
# The icons example's trainer image, localhost/murmur-example-icons:0.1.0, from a built
# icons-trainer on the trainer images' runtime base (localhost/murmur-runtime-base:bookworm, which
# images/build.sh --local-base makes), saved as an OCI archive for nodes to import. Prints the
# archive's path.
#
#   examples/icons/image.sh BINARIES OUT    # BINARIES holds icons-trainer; the archive goes to OUT
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck disable=SC2034 # read by say.sh
SAY_AS=examples/icons/image.sh
# shellcheck source=../../e2e/support/say.sh
source "$REPO/e2e/support/say.sh"
BINARIES=${1:?usage: examples/icons/image.sh BINARIES OUT}
OUT=${2:?usage: examples/icons/image.sh BINARIES OUT}
IMAGE=localhost/murmur-example-icons:0.1.0
BASE=localhost/murmur-runtime-base:bookworm
[[ -x $BINARIES/icons-trainer ]] || die "$BINARIES/icons-trainer is missing (cargo build -p murmur-example-icons)"
# The settings this kind of machine needs (as images/build.sh).
export CONTAINERS_CONF=${CONTAINERS_CONF:-$REPO/e2e/controlplane/node/containers.conf}
podman image exists "$BASE" || die "$BASE is missing: images/build.sh --local-base makes it"
context=$(mktemp -d /tmp/murmur-icons.XXXXXX)
trap 'rm -rf "$context"' EXIT
ln "$BINARIES/icons-trainer" "$context/" 2>/dev/null || cp "$BINARIES/icons-trainer" "$context/"
started=$SECONDS
podman build --quiet -f "$HERE/Containerfile" --build-arg BINARIES=prebuilt \
    --build-arg "RUNTIME_IMAGE=$BASE" -t "$IMAGE" "$context" >/dev/null || die "building $IMAGE failed"
podman image prune -f >/dev/null 2>&1 || true
mkdir -p "$OUT"
archive=$OUT/murmur-example-icons.tar
rm -f "$archive"
podman save --quiet --format oci-archive -o "$archive" "$IMAGE"
say "built and saved $IMAGE in $((SECONDS - started)) s"
echo "$archive"
