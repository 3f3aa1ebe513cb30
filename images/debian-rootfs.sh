#!/usr/bin/env bash
# Makes a container image from a Debian bookworm root filesystem that mmdebstrap builds out of
# Debian's packages, for machines that cannot pull the public bases (images/build.sh
# --local-base, and the real nodes of e2e/controlplane). Does nothing if the image exists.
#
#   images/debian-rootfs.sh IMAGE [MMDEBSTRAP-OPTION]...
#   images/debian-rootfs.sh localhost/murmur-runtime-base:bookworm --variant=extract --include=libc6,libgcc-s1
#
# The packages come from this machine's own apt sources; those sources, and apt's lists, are
# removed from the image, so that no mirror host is written into it. Needs mmdebstrap and podman
# (or docker: CONTAINER_ENGINE=docker).
set -euo pipefail

IMAGE=${1:?usage: images/debian-rootfs.sh IMAGE [MMDEBSTRAP-OPTION]...}
shift
ENGINE=${CONTAINER_ENGINE:-$(command -v podman || command -v docker || echo podman)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../e2e/support/say.sh
source "$HERE/../e2e/support/say.sh"

"$ENGINE" image inspect "$IMAGE" >/dev/null 2>&1 && exit 0
command -v mmdebstrap >/dev/null || { say "mmdebstrap is needed (apt-get install mmdebstrap)"; exit 1; }
sources=
for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    if [[ -s $f ]]; then sources=$f; break; fi
done
[[ -n $sources ]] || { say "no apt sources on this machine to take Debian's packages from"; exit 1; }

root=$(mktemp -d /tmp/murmur-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
started=$SECONDS
mmdebstrap --quiet "$@" bookworm "$root" "$sources" || { say "mmdebstrap failed for $IMAGE"; exit 1; }
rm -rf "$root"/etc/apt/sources.list "$root"/etc/apt/sources.list.d "$root"/var/lib/apt/lists
mkdir -p "$root"/etc/apt/sources.list.d
tar -C "$root" -c . | "$ENGINE" import - "$IMAGE" >/dev/null
say "$IMAGE made in $((SECONDS - started)) s"
