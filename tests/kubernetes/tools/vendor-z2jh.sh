#!/usr/bin/env bash
# Vendor a Zero to JupyterHub chart package under helm/trainhub/charts/ exactly as
# `helm dependency update` leaves it (charts/jupyterhub-X.tgz and a Chart.lock naming
# https://hub.jupyter.org/helm-chart/), without reaching that repository: helm resolves the
# dependency from a repository index served on loopback and registered under the real URL.
#   usage: tests/kubernetes/tools/vendor-z2jh.sh /path/to/jupyterhub-4.4.0.tgz
# The package in the repository came from ../shared/vendor/jupyterhub-4.4.0.tgz (upstream tag 4.4.0,
# chartpress placeholders filled), sha256 f4fd87eb723ef6d8a33feaefd926de3a06e5d2a9530b8e6ddfae96b5e0667bea.
set -euo pipefail
pkg="$(realpath "${1:?usage: $0 jupyterhub-X.Y.Z.tgz}")"
root="$(cd "$(dirname "$0")/../../.." && pwd)"
helm="$("$root/tests/kubernetes/tools/get-helm.sh")/helm"
work="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

export HELM_CONFIG_HOME="$work/config" HELM_CACHE_HOME="$work/cache" HELM_DATA_HOME="$work/data"
export HELM_REPOSITORY_CONFIG="$work/config/repositories.yaml" HELM_REPOSITORY_CACHE="$work/cache/repository"
mkdir -p "$work/repo" "$HELM_CONFIG_HOME" "$HELM_REPOSITORY_CACHE"
cp "$pkg" "$work/repo/"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$helm" repo index "$work/repo" --url "http://127.0.0.1:$port/"
cp "$work/repo/index.yaml" "$HELM_REPOSITORY_CACHE/jupyterhub-index.yaml"
printf 'apiVersion: ""\ngenerated: "0001-01-01T00:00:00Z"\nrepositories:\n- name: jupyterhub\n  url: https://hub.jupyter.org/helm-chart/\n' \
    > "$HELM_REPOSITORY_CONFIG"
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$work/repo" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/index.yaml')" 2>/dev/null && break
    sleep 0.1
done
"$helm" dependency update --skip-refresh "$root/helm/trainhub"
"$helm" dependency list "$root/helm/trainhub"
