#!/usr/bin/env bash
# Build (once) the real Kubernetes control plane the test suite runs against:
# kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2 from Debian bookworm's
# source package `kubernetes`, plus Debian's etcd-server. Binaries land in
#   ${TRAINHUB_KUBE_CACHE:-~/.cache/trainhub/kube-1.20.2}/bin
# outside the clone; a second run with the binaries present only checks them (seconds).
#
# Needs (installed here with apt when run as root, otherwise named and refused): a deb-src line for
# bookworm + bookworm-security and APT_PACKAGES below. `build.sh --packages-only` installs just those
# (.ci/run calls it). Cold: 12-14 min on 2 busy cores (measured), about 1.4 GB peak memory, about
# 3 GB disk while building (deleted afterwards; the three binaries keep 250 MB). Warm: about 2 s.
set -euo pipefail

KUBE_VERSION=1.20.2
KUBE_GIT_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56  # upstream v1.20.2 (hack/lib/version.sh)
RECIPE=2  # bump when the build changes: cached binaries of another recipe are rebuilt
DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
CACHE="${TRAINHUB_KUBE_CACHE:-$HOME/.cache/trainhub/kube-$KUBE_VERSION}"
BIN="$CACHE/bin"
STAMP="$BIN/BUILD-INFO"
# everything the Kubernetes tests need from Debian: the build (dpkg-dev for apt-get source, Go 1.19,
# reflect2 1.0.2, make), etcd, openssl (controlplane.py's certificates) and unzip (tools/get-helm.sh)
APT_PACKAGES=(dpkg-dev golang-1.19-go golang-github-modern-go-reflect2-dev etcd-server make rsync openssl unzip)
NICE=(nice -n 19)

log() { echo "[kube-build $(date +%H:%M:%S)] $*" >&2; }

have_binaries() {
    [ -f "$STAMP" ] || return 1
    grep -qx "recipe $RECIPE" "$STAMP" || return 1
    for b in kube-apiserver kube-controller-manager kube-scheduler; do
        [ -x "$BIN/$b" ] || return 1
    done
    # the stamp holds a sha256 per binary: a truncated or foreign binary is rebuilt
    (cd "$BIN" && grep '^sha256 ' "$STAMP" | sed 's/^sha256 //' | sha256sum --quiet -c -) || return 1
    "$BIN/kube-apiserver" --version 2>/dev/null | grep -q "v$KUBE_VERSION" || return 1
}

ensure_packages() {
    local missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    local need_src=1
    if grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ || grep -qs '^deb-src ' /etc/apt/sources.list; then
        need_src=0
    fi
    if [ ${#missing[@]} -eq 0 ] && [ $need_src -eq 0 ]; then
        return 0
    fi
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        log "missing: ${missing[*]:-} $([ $need_src = 1 ] && echo 'a deb-src line for bookworm')"
        log "install them (Debian bookworm, as root) or run .ci/run once; see docs/kubernetes.md"
        exit 2
    fi
    if [ $need_src -eq 1 ]; then
        log "adding deb-src for bookworm and bookworm-security"
        cat > /etc/apt/sources.list.d/trainhub-deb-src.sources <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    fi
    log "apt-get install ${missing[*]:-}(+ update)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    if [ ${#missing[@]} -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

ensure_packages
if [ "${1:-}" = "--packages-only" ]; then
    exit 0
fi

ETCD="$(command -v etcd || echo /usr/bin/etcd)"
[ -x "$ETCD" ] || { log "etcd not found after installing etcd-server"; exit 2; }

if have_binaries; then
    log "cached: $BIN ($(grep '^built ' "$STAMP" | cut -d' ' -f2-))"
    exit 0
fi

GO=/usr/lib/go-1.19/bin/go
[ -x "$GO" ] || { log "$GO missing (golang-1.19-go)"; exit 2; }

mkdir -p "$CACHE"
# one build at a time per cache (two test sessions starting cold must not build twice)
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
    log "another build holds $CACHE/.build.lock; waiting for it"
    flock 9
    if have_binaries; then log "built by the other process"; exit 0; fi
fi

WORK="$(mktemp -d "$CACHE/work.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)

log "apt-get source kubernetes=$DEB_VERSION into $WORK"
(cd "$WORK" && apt-get source -qq "kubernetes=$DEB_VERSION" >/dev/null 2>"$WORK/apt-source.log") || {
    cat "$WORK/apt-source.log" >&2; log "apt-get source failed"; exit 1; }
SRC="$(find "$WORK" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' | head -n1)"
[ -n "$SRC" ] || { log "no kubernetes-* folder after apt-get source"; exit 1; }

# GOPATH mode: Debian's tarball is the upstream tree with vendor/; modules would try the network
export GOPATH="$WORK/gopath" GO111MODULE=off GOCACHE="$WORK/gocache" CGO_ENABLED=0 \
       PATH="/usr/lib/go-1.19/bin:$PATH"
unset GOFLAGS
mkdir -p "$GOPATH/src/k8s.io" "$GOPATH/bin"
ln -s "$SRC" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"

# reflect2 1.0.1 (vendored) crashes under Go >= 1.18; Debian ships 1.0.2
log "vendor: reflect2 1.0.1 -> Debian's 1.0.2"
rm -rf vendor/github.com/modern-go/reflect2
cp -rL /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2

# the generated OpenAPI definitions are not in the tarball
log "openapi-gen"
"${NICE[@]}" go build -o "$GOPATH/bin/openapi-gen" k8s.io/kubernetes/vendor/k8s.io/kube-openapi/cmd/openapi-gen
# input packages exactly as build/root/Makefile.generated_files picks them for the KUBE target:
# every Go dir of the tree (staging/src named as vendor/, the real vendor/ left out) with a
# `// +k8s:openapi-gen=` tag, except code-generator and sample-apiserver
OPENAPI_PKGS="$(find -H . \( -path './_*' -o -path './.*' -o -path ./vendor -o -path ./debian \) -prune \
        -o -type f -name '*.go' -print0 \
    | { xargs -0 grep -l '^// *+k8s:' || true; } | { xargs grep -l '+k8s:openapi-gen=' || true; } \
    | sed 's|^\./||; s|^staging/src/|vendor/|; s|/[^/]*$||' | LC_ALL=C sort -u \
    | grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' \
    | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)"
"${NICE[@]}" "$GOPATH/bin/openapi-gen" \
    -i "$OPENAPI_PKGS" \
    -p k8s.io/kubernetes/pkg/generated/openapi \
    -O zz_generated.openapi \
    -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
    -r "$WORK/openapi-violations.txt" >"$WORK/openapi-gen.log" 2>&1 || {
        tail -n 40 "$WORK/openapi-gen.log" >&2; log "openapi-gen failed"; exit 1; }
[ -s pkg/generated/openapi/zz_generated.openapi.go ] || { log "openapi-gen wrote nothing"; exit 1; }

# version stamps as hack/lib/version.sh sets them (both copies: /version and --version read different ones)
LDFLAGS="-s -w"
for pkg in k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version k8s.io/kubernetes/vendor/k8s.io/component-base/version; do
    LDFLAGS="$LDFLAGS -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=20"
    LDFLAGS="$LDFLAGS -X $pkg.gitCommit=$KUBE_GIT_COMMIT -X $pkg.gitTreeState=archive"
    LDFLAGS="$LDFLAGS -X $pkg.buildDate=2021-01-13T13:20:00Z"
done
mkdir -p "$BIN.new"
for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
    log "go build $cmd"
    "${NICE[@]}" go build -p 2 -tags selinux,notest -ldflags "$LDFLAGS" -o "$BIN.new/$cmd" "k8s.io/kubernetes/cmd/$cmd"
done
"$BIN.new/kube-apiserver" --version | grep -q "v$KUBE_VERSION" || {
    "$BIN.new/kube-apiserver" --version >&2; log "built apiserver does not say v$KUBE_VERSION"; exit 1; }

{
    echo "recipe $RECIPE"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - start ))s from kubernetes $DEB_VERSION with $(go version | cut -d' ' -f3)"
    (cd "$BIN.new" && sha256sum kube-apiserver kube-controller-manager kube-scheduler | sed 's/^/sha256 /')
} > "$BIN.new/BUILD-INFO"
rm -rf "$BIN"
mv "$BIN.new" "$BIN"
log "done in $(( $(date +%s) - start ))s: $BIN"
