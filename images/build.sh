#!/usr/bin/env bash
# Builds murmur's images from images/*.Dockerfile: the operator and the CPU trainer (and the CUDA
# trainer with --cuda), with podman, buildah's engine, or docker.
#
#   images/build.sh [--binaries DIR] [--local-base | --runtime-image IMAGE] [--cuda]
#                   [--repository PREFIX] [--tag TAG] [--save DIR] [--import]
#
#   --binaries DIR        copy `murmur` and `murmur-trainer` (and `murmur-trainer-cuda` with
#                         --cuda) from DIR, e.g. target/release after `cargo build --release`,
#                         instead of compiling them inside the build (the Dockerfiles' prebuilt
#                         stages; both ways end in the same runtime stage)
#   --local-base          the runtime base made on this machine from Debian's packages
#                         (images/debian-rootfs.sh: glibc and libgcc, as distroless/cc has them),
#                         for machines that cannot pull gcr.io/distroless
#   --runtime-image IMAGE any other runtime base (a glibc root filesystem)
#   --cuda                the CUDA trainer too (its base, nvidia/cuda, must be pullable)
#   --repository PREFIX   names PREFIX/murmur-operator and PREFIX/murmur-trainer
#                         (default ghcr.io/murmur-dev, the chart's defaults)
#   --tag TAG             default: the workspace version, as the chart's appVersion
#   --save DIR            also write each image as an OCI archive DIR/<name>.tar
#   --import              import them into every real node of the control plane in
#                         $MURMUR_CONTROLPLANE_DIR (e2e/controlplane/nodes.sh load), which is
#                         where a cluster here pulls from; elsewhere, push to your registry
#
# Prints each image's name, one per line, on stdout; progress and timings on stderr.
# CONTAINER_ENGINE=docker picks docker where podman is installed too.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck disable=SC2034 # read by say.sh
SAY_AS=images/build.sh
# shellcheck source=../e2e/support/say.sh
source "$HERE/../e2e/support/say.sh"
usage() { sed -n '/^#   images\/build.sh \[/,/^# CONTAINER_ENGINE/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

BINARIES='' LOCAL_BASE=0 RUNTIME_IMAGE='' CUDA=0 REPOSITORY=ghcr.io/murmur-dev TAG='' SAVE='' IMPORT=0
while (($#)); do
    case $1 in
    --binaries) BINARIES=${2:?--binaries DIR}; shift ;;
    --local-base) LOCAL_BASE=1 ;;
    --runtime-image) RUNTIME_IMAGE=${2:?--runtime-image IMAGE}; shift ;;
    --cuda) CUDA=1 ;;
    --repository) REPOSITORY=${2:?--repository PREFIX}; shift ;;
    --tag) TAG=${2:?--tag TAG}; shift ;;
    --save) SAVE=${2:?--save DIR}; shift ;;
    --import) IMPORT=1 ;;
    -h | --help) usage ;;
    *) say "unknown argument $1"; usage ;;
    esac
    shift
done
((LOCAL_BASE == 0)) || [[ -z $RUNTIME_IMAGE ]] || die "--local-base and --runtime-image: one or the other"
TAG=${TAG:-$(awk -F'"' '/^\[workspace.package\]/ {p = 1} p && /^version/ {print $2; exit}' "$REPO/Cargo.toml")}

ENGINE=${CONTAINER_ENGINE:-$(command -v podman || command -v docker)} ||
    die "podman or docker is needed (apt-get install podman)"
export CONTAINER_ENGINE=$ENGINE
# podman here: the settings this kind of machine needs (e2e/controlplane/node/containers.conf).
[[ $(basename "$ENGINE") != podman || -n ${CONTAINERS_CONF:-} ]] ||
    export CONTAINERS_CONF=$REPO/e2e/controlplane/node/containers.conf

args=()
if ((LOCAL_BASE)); then
    RUNTIME_IMAGE=localhost/murmur-runtime-base:bookworm
    # What distroless/cc holds that a Rust binary links: glibc and libgcc, plus base-files,
    # netbase and tzdata; extracted only, with no package manager and no shell.
    "$HERE/debian-rootfs.sh" "$RUNTIME_IMAGE" --variant=extract --include=libc6,libgcc-s1,base-files,netbase,tzdata
fi
[[ -z $RUNTIME_IMAGE ]] || args+=(--build-arg "RUNTIME_IMAGE=$RUNTIME_IMAGE")

# The build context: the repository (compiled inside the build), or a directory holding only
# the binaries (the prebuilt stages COPY them from its root).
context=$REPO
if [[ -n $BINARIES ]]; then
    context=$(mktemp -d /tmp/murmur-images.XXXXXX)
    trap 'rm -rf "$context"' EXIT
    wanted=(murmur murmur-trainer)
    ((CUDA)) && wanted+=(murmur-trainer-cuda)
    for b in "${wanted[@]}"; do
        [[ -x $BINARIES/$b ]] || die "$BINARIES/$b is missing (cargo build --release$([[ $b == *cuda ]] && echo ' --features cuda, copied to that name'))"
        # A hard link where it can (same filesystem), else a copy.
        ln "$BINARIES/$b" "$context/$b" 2>/dev/null || cp "$BINARIES/$b" "$context/$b"
    done
    args+=(--build-arg BINARIES=prebuilt)
fi

images=()
# build NAME DOCKERFILE [TARGET]
build() {
    local image=$REPOSITORY/$1:$2 started=$SECONDS target=()
    [[ -z ${4:-} ]] || target=(--target "$4")
    say "building $image"
    "$ENGINE" build --quiet -f "$HERE/$3" "${target[@]}" "${args[@]}" -t "$image" "$context" >/dev/null ||
        die "building $image failed"
    say "built $image in $((SECONDS - started)) s"
    images+=("$image")
}
build murmur-operator "$TAG" operator.Dockerfile
build murmur-trainer "$TAG" trainer.Dockerfile cpu
((CUDA)) && build murmur-trainer "$TAG-cuda" trainer.Dockerfile cuda
# The prebuilt stages leave unnamed images behind.
[[ $(basename "$ENGINE") != podman ]] || podman image prune -f >/dev/null 2>&1 || true

archives=()
if [[ -n $SAVE || $IMPORT == 1 ]]; then
    out=${SAVE:-$(mktemp -d /tmp/murmur-archives.XXXXXX)}
    mkdir -p "$out"
    for image in "${images[@]}"; do
        started=$SECONDS
        name=${image##*/}
        archive=$out/${name//:/_}.tar
        rm -f "$archive"
        if [[ $(basename "$ENGINE") == podman ]]; then
            podman save --quiet --format oci-archive -o "$archive" "$image"
        else
            docker save -o "$archive" "$image"
        fi
        say "saved $image as $archive in $((SECONDS - started)) s"
        archives+=("$archive")
    done
fi
if ((IMPORT)); then
    started=$SECONDS
    "$REPO/e2e/controlplane/nodes.sh" load "${archives[@]}"
    say "imported into the real nodes in $((SECONDS - started)) s"
    [[ -n $SAVE ]] || rm -rf "$out"
fi
printf '%s\n' "${images[@]}"
