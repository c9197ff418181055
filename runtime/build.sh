#!/usr/bin/env bash
# Build an image of a stack from the stack's mirror and record its digest from the build.
#
#   runtime/build.sh serving STACK TAG   the serving image (runtime/Dockerfile) -> serving.image.digest
#   runtime/build.sh plugin STACK        the Argo plugin image (runtime/plugins.Dockerfile) -> the mirror lock
#
# Needs docker buildx (BuildKit >= 0.13 for rewrite-timestamp) logged in to the stack's
# registry, and the bases mirrored with recorded digests (dsvolc images STACK --script,
# then --record). Reproducible inputs: bases by digest, pinned packages
# (runtime/requirements.txt), SOURCE_DATE_EPOCH = the commit's time, layer timestamps
# rewritten to it, no provenance attestation (it embeds the build's time and host).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?usage: runtime/build.sh serving STACK TAG | plugin STACK}
stack=${2:?stack name}
dsvolc=(python -m dsvolc.cli images "$stack")
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)
export SOURCE_DATE_EPOCH
meta=$(mktemp)
trap 'rm -f "$meta"' EXIT
build=(docker buildx build --provenance=false --sbom=false --metadata-file "$meta")

case "$what" in
  serving)
    tag=${3:?image tag, e.g. v0.32.0-dsv1 as in serving.image.tag}
    base=$("${dsvolc[@]}" --ref vllm-base)     # fails unless the base's digest is recorded
    repo=$("${dsvolc[@]}" --ref serving)
    "${build[@]}" --file runtime/Dockerfile --build-arg "VLLM_IMAGE=$base" \
      --output "type=image,name=$repo:$tag,push=true,rewrite-timestamp=true" .
    "${dsvolc[@]}" --record-build "$meta" --image serving
    ;;
  plugin)
    base=$("${dsvolc[@]}" --ref plugin-base)
    read -r url sha target < <("${dsvolc[@]}" --plugin-build-args)
    "${build[@]}" --file runtime/plugins.Dockerfile --build-arg "BASE_IMAGE=$base" \
      --build-arg "PLUGIN_URL=$url" --build-arg "PLUGIN_SHA256=$sha" \
      --output "type=image,name=$target,push=true,rewrite-timestamp=true" runtime
    "${dsvolc[@]}" --record-build "$meta" --image plugin
    ;;
  *) echo "unknown image $what; expected serving or plugin" >&2; exit 2 ;;
esac
