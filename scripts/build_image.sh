#!/usr/bin/env bash
# Build the GPU image from Dockerfile.cuda, with docker or, where there is none, buildah.
#
#   scripts/build_image.sh [TAG] [--cuda 12|13] [-- BUILDER_OPTIONS...]
#
#   TAG       the image's name (default: tensorgate:cuda12, or tensorgate:cuda13 with --cuda 13)
#   --cuda    the CUDA major of the whole stack, Dockerfile.cuda's only build argument (CUDA):
#             12 (default; drivers >= 525) or 13 (drivers >= 580)
#   -- ...    passed to the builder's build command as they are (--no-cache, --pull, ...)
#
# The image runs `tensorgate` (its entrypoint) and answers to `tritonserver` too, on PATH and
# at /opt/tritonserver/bin/tritonserver; it listens on 8000 (HTTP), 8001 (gRPC), 8002 (metrics).
# The build downloads the CUDA base image and every wheel of the chosen stack (the result is
# about 7 GB): it needs the network and a few minutes, and is not run by CI.
#
# Builder: docker when its daemon answers (with BuildKit, which the Dockerfile needs), else
# buildah (rootless-friendly: --isolation chroot and the vfs storage driver, which need neither
# user namespaces nor fuse-overlayfs; --format docker keeps the HEALTHCHECK, which OCI images
# cannot hold). buildah keeps the image in its own vfs store: push it from there
# (buildah --storage-driver vfs push TAG docker://REGISTRY/NAME:TAG) or run it with
# podman --storage-driver vfs.
#
# Environment:
#   BUILDER   docker or buildah, to choose instead of the rule above
#   CUDA      the default for --cuda (12)
set -euo pipefail

die() {
    echo "build_image: error: $*" >&2
    exit 1
}
log() { echo "build_image: $*" >&2; }

here="${BASH_SOURCE[0]%/*}"
[[ "$here" == "${BASH_SOURCE[0]}" ]] && here=.
ROOT="$(cd "$here/.." && pwd)"
DOCKERFILE="$ROOT/Dockerfile.cuda"

cuda="${CUDA:-12}"
tag=""
extra=()
while (($#)); do
    case "$1" in
        --cuda) (($# >= 2)) || die "--cuda needs a value (12 or 13)"; cuda="$2"; shift 2 ;;
        --cuda=*) cuda="${1#--cuda=}"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d'; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        -*) die "unknown option $1 (builder options go after --)" ;;
        *) [[ -z "$tag" ]] || die "one tag only (got $tag and $1)"; tag="$1"; shift ;;
    esac
done
[[ "$cuda" == 12 || "$cuda" == 13 ]] || die "--cuda must be 12 or 13 (got $cuda)"
tag="${tag:-tensorgate:cuda$cuda}"
[[ -f "$DOCKERFILE" ]] || die "no $DOCKERFILE"

builder="${BUILDER:-}"
if [[ -z "$builder" ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        builder=docker
    elif command -v buildah >/dev/null; then
        builder=buildah
        command -v docker >/dev/null && log "docker is installed but its daemon does not answer: using buildah"
    elif command -v docker >/dev/null; then
        die "docker is installed but its daemon does not answer (docker info), and there is no buildah"
    else
        die "neither docker nor buildah is installed"
    fi
fi

log "building $tag (CUDA $cuda) with $builder"
case "$builder" in
    docker)
        DOCKER_BUILDKIT=1 docker build --file "$DOCKERFILE" --tag "$tag" \
            --build-arg "CUDA=$cuda" ${extra[@]+"${extra[@]}"} "$ROOT"
        ;;
    buildah)
        buildah --storage-driver vfs build --isolation chroot --format docker \
            --file "$DOCKERFILE" --tag "$tag" --build-arg "CUDA=$cuda" \
            ${extra[@]+"${extra[@]}"} "$ROOT"
        ;;
    *) die "BUILDER must be docker or buildah (got $builder)" ;;
esac

log "built $tag; run it with: docker run --gpus all -p 8000-8002:8000-8002 -v \$PWD/models:/models $tag"
echo "$tag"
