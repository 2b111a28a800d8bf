#!/usr/bin/env bash
# Build (once) the real Kubernetes pieces the test suite runs, from Debian bookworm's source package
# `kubernetes` (v1.20.2), into
#   ${TRAINHUB_KUBE_CACHE:-~/.cache/trainhub/kube-1.20.2}/bin
# outside the clone, in two sets, each cached under a key of its own recipe:
#   control-plane: kube-apiserver, kube-controller-manager, kube-scheduler (+ Debian's etcd-server);
#   node:          kubelet and trainhub-fake-gpu (tests/kubernetes/node/fakegpu: a device plugin that
#                  advertises simulated GPUs), for the real node of tests/kubernetes/node/.
# A set whose binaries are present, verified and of the current recipe is not built again (seconds).
#
#   build.sh [--packages-only | --check] [control-plane|node|all]      (default: all)
#
# --check prints the units that would be built ("stale: kubelet pause") and exits 1 if any, 0 if none.
#
# Needs (installed here with apt when run as root, otherwise named and refused): a deb-src line for
# bookworm + bookworm-security and APT_PACKAGES below. `build.sh --packages-only` installs just those
# (.ci/run calls it). Cold, 2 busy cores (measured 2026-11-27 at load 7-8): control plane 19.5 min (12-14 min
# quiet), then the kubelet 3 min (4 min alone), the device plugin and pause seconds; about 1.4 GB peak memory,
# about 3 GB disk while building (deleted afterwards; the binaries keep about 370 MB). Warm: about 2 s.
set -euo pipefail

KUBE_VERSION=1.20.2
KUBE_GIT_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56  # upstream v1.20.2 (hack/lib/version.sh)
DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FAKEGPU_SRC="$HERE/../node/fakegpu/main.go"
# Each unit's recipe key: bump the number when its build changes (the device plugin's key also holds its
# source hash); a cached unit of another key is rebuilt, the others are kept.
CONTROL_PLANE_RECIPE="2"
KUBELET_RECIPE="1"
FAKEGPU_RECIPE="1 $(sha256sum "$FAKEGPU_SRC" | cut -c1-16)"
PAUSE_RECIPE="1 gcc-static"
CONTROL_PLANE_BINS=(kube-apiserver kube-controller-manager kube-scheduler)
NODE_UNITS=(kubelet trainhub-fake-gpu pause)
CACHE="${TRAINHUB_KUBE_CACHE:-$HOME/.cache/trainhub/kube-$KUBE_VERSION}"
BIN="$CACHE/bin"
# everything the Kubernetes tests need from Debian: the build (dpkg-dev for apt-get source, Go 1.19,
# reflect2 1.0.2, make), etcd, openssl (controlplane.py's certificates), unzip (tools/get-helm.sh);
# for the real node: containerd 1.6 + runc (crun fails on these hybrid-cgroup machines), the CNI
# plugins, debootstrap (the images' root file systems), iproute2 (the bridge's removal), gcc and libc6-dev
# (the static pause binary of pod sandboxes, from the tree's own pause.c)
APT_PACKAGES=(dpkg-dev golang-1.19-go golang-github-modern-go-reflect2-dev etcd-server make rsync openssl unzip
              containerd runc containernetworking-plugins debootstrap iproute2 gcc libc6-dev)
APT=(apt-get -o DPkg::Lock::Timeout=600)  # wait for another apt (unattended upgrades, a second build)
NICE=(nice -n 19)

log() { echo "[kube-build $(date +%H:%M:%S)] $*" >&2; }

# units: control-plane (its three binaries, stamp BUILD-INFO) and each node binary (stamp <name>.BUILD-INFO)
stamp_of() { [ "$1" = control-plane ] && echo "$BIN/BUILD-INFO" || echo "$BIN/$1.BUILD-INFO"; }
recipe_of() {
    case "$1" in
        control-plane) echo "$CONTROL_PLANE_RECIPE" ;; kubelet) echo "$KUBELET_RECIPE" ;;
        trainhub-fake-gpu) echo "$FAKEGPU_RECIPE" ;; pause) echo "$PAUSE_RECIPE" ;;
    esac
}
bins_of() { if [ "$1" = control-plane ]; then echo "${CONTROL_PLANE_BINS[@]}"; else echo "$1"; fi; }

# have UNIT: its binaries are present, of the current recipe, and match their recorded sha256
have() {
    local stamp b
    stamp="$(stamp_of "$1")"
    [ -f "$stamp" ] || return 1
    grep -qxF "recipe $(recipe_of "$1")" "$stamp" || return 1
    for b in $(bins_of "$1"); do
        [ -x "$BIN/$b" ] || return 1
        grep -q " $b\$" "$stamp" || return 1
    done
    # the stamp holds a sha256 per binary: a truncated or foreign binary is rebuilt
    (cd "$BIN" && grep '^sha256 ' "$stamp" | sed 's/^sha256 //' | sha256sum --quiet -c - >/dev/null 2>&1) || return 1
    case "$1" in
        control-plane) "$BIN/kube-apiserver" --version 2>/dev/null | grep -q "v$KUBE_VERSION" || return 1 ;;
        kubelet) "$BIN/kubelet" --version 2>/dev/null | grep -q "v$KUBE_VERSION" || return 1 ;;
    esac
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
    DEBIAN_FRONTEND=noninteractive "${APT[@]}" update -qq
    if [ ${#missing[@]} -gt 0 ]; then
        DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}"
    fi
}

PACKAGES_ONLY=0
CHECK=0
WANT=all
for arg in "$@"; do
    case "$arg" in
        --packages-only) PACKAGES_ONLY=1 ;;
        --check) CHECK=1 ;;
        control-plane|node|all) WANT="$arg" ;;
        *) log "unknown argument $arg (build.sh [--packages-only | --check] [control-plane|node|all])"; exit 2 ;;
    esac
done
if [ $CHECK = 0 ]; then
    ensure_packages
fi
if [ $PACKAGES_ONLY = 1 ]; then
    exit 0
fi

case "$WANT" in all) SETS=(control-plane "${NODE_UNITS[@]}") ;; node) SETS=("${NODE_UNITS[@]}") ;; *) SETS=("$WANT") ;; esac
missing_sets() {
    local s out=()
    for s in "${SETS[@]}"; do have "$s" || out+=("$s"); done
    echo "${out[@]}"
}
TODO=($(missing_sets))
if [ $CHECK = 1 ]; then
    echo "stale: ${TODO[*]:-}"
    [ ${#TODO[@]} -eq 0 ]
    exit
fi
ETCD="$(command -v etcd || echo /usr/bin/etcd)"
[ -x "$ETCD" ] || { log "etcd not found after installing etcd-server"; exit 2; }
if [ ${#TODO[@]} -eq 0 ]; then
    for s in "${SETS[@]}"; do log "cached $s: $BIN ($(grep '^built ' "$(stamp_of "$s")" | cut -d' ' -f2-))"; done
    exit 0
fi

GO=/usr/lib/go-1.19/bin/go
[ -x "$GO" ] || { log "$GO missing (golang-1.19-go)"; exit 2; }

mkdir -p "$CACHE" "$BIN"
# one build at a time per cache (two test sessions starting cold must not build twice)
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
    log "another build holds $CACHE/.build.lock; waiting for it"
    flock 9
fi
TODO=($(missing_sets))
if [ ${#TODO[@]} -eq 0 ]; then log "built by the other process"; exit 0; fi

WORK="$(mktemp -d "$CACHE/work.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
log "building: ${TODO[*]}"

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

# version stamps as hack/lib/version.sh sets them (both copies: /version and --version read different ones)
LDFLAGS="-s -w"
for pkg in k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version k8s.io/kubernetes/vendor/k8s.io/component-base/version; do
    LDFLAGS="$LDFLAGS -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=20"
    LDFLAGS="$LDFLAGS -X $pkg.gitCommit=$KUBE_GIT_COMMIT -X $pkg.gitTreeState=archive"
    LDFLAGS="$LDFLAGS -X $pkg.buildDate=2021-01-13T13:20:00Z"
done

build_control_plane() {
    # the generated OpenAPI definitions are not in the tarball (the apiserver needs them)
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
    for cmd in "${CONTROL_PLANE_BINS[@]}"; do
        log "go build $cmd"
        "${NICE[@]}" go build -p 2 -tags selinux,notest -ldflags "$LDFLAGS" -o "$OUT/$cmd" "k8s.io/kubernetes/cmd/$cmd"
    done
    "$OUT/kube-apiserver" --version | grep -q "v$KUBE_VERSION" || {
        "$OUT/kube-apiserver" --version >&2; log "built apiserver does not say v$KUBE_VERSION"; exit 1; }
}

build_unit() {
    case "$1" in
        control-plane) build_control_plane ;;
        kubelet)
            log "go build kubelet"
            "${NICE[@]}" go build -p 2 -tags selinux,notest -ldflags "$LDFLAGS" -o "$OUT/kubelet" k8s.io/kubernetes/cmd/kubelet
            "$OUT/kubelet" --version | grep -q "v$KUBE_VERSION" || {
                "$OUT/kubelet" --version >&2; log "built kubelet does not say v$KUBE_VERSION"; exit 1; } ;;
        trainhub-fake-gpu)
            # inside the tree, so GOPATH mode resolves its imports from the tree's vendor/ (gRPC, the device plugin API)
            log "go build trainhub-fake-gpu"
            mkdir -p cmd/trainhub-fake-gpu
            cp "$FAKEGPU_SRC" cmd/trainhub-fake-gpu/main.go
            "${NICE[@]}" go build -p 2 -ldflags "-s -w" -o "$OUT/trainhub-fake-gpu" k8s.io/kubernetes/cmd/trainhub-fake-gpu ;;
        pause)
            # the pod sandboxes' pause process: upstream build/pause/linux/pause.c, static as upstream builds it
            log "gcc pause"
            "${NICE[@]}" gcc -Os -Wall -Werror -static -DVERSION=v3.4-trainhub -o "$OUT/pause" build/pause/linux/pause.c
            strip "$OUT/pause" ;;
    esac
}

for set in "${TODO[@]}"; do
    set_start=$(date +%s)
    OUT="$WORK/out-$set"
    mkdir -p "$OUT"
    build_unit "$set"
    stamp="$(stamp_of "$set")"
    # the stamp goes last: a set is cached only when all of it is in place
    rm -f "$stamp"
    for b in $(bins_of "$set"); do mv -f "$OUT/$b" "$BIN/$b"; done
    {
        echo "recipe $(recipe_of "$set")"
        echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(( $(date +%s) - set_start ))s from kubernetes $DEB_VERSION with $(go version | cut -d' ' -f3)"
        (cd "$BIN" && sha256sum $(bins_of "$set") | sed 's/^/sha256 /')
    } > "$stamp"
    log "$set done in $(( $(date +%s) - set_start ))s"
done
log "done in $(( $(date +%s) - start ))s: $BIN"
