#!/usr/bin/env bash
# Builds the etcd and kube-apiserver binaries that kube/kubetest runs its
# manifests against, from the Go module in tools/kube-apiserver (through the
# Go module proxy, like any other dependency). The binaries go to a cache
# directory keyed by their versions, and the build is skipped when both are
# already there. Progress goes to stderr; the directory is the one line on
# stdout, so that:
#
#   export OMNIPD_KUBE_ASSETS="$(./scripts/kube-assets.sh)"
#
# OMNIPD_KUBE_ASSETS, when set, names the directory to fill instead.
set -euo pipefail
cd "$(dirname "$0")/.."

mod=tools/kube-apiserver
kube=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { sub(/^v/, "", $2); print $2; exit }' "$mod/go.mod")
etcd=$(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ { sub(/^v/, "", $2); print $2; exit }' "$mod/go.mod")
if [ -z "$kube" ] || [ -z "$etcd" ]; then
  echo "kube-assets: cannot read the kubernetes and etcd versions from $mod/go.mod" >&2
  exit 1
fi
dir="${OMNIPD_KUBE_ASSETS:-$HOME/.cache/omnipd/kube-$kube-etcd-$etcd}"

if [ -x "$dir/etcd" ] && [ -x "$dir/kube-apiserver" ]; then
  echo "kube-assets: etcd $etcd and kube-apiserver $kube already in $dir" >&2
  echo "$dir"
  exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "kube-assets: building etcd $etcd and kube-apiserver $kube into $dir (a few minutes when cold)" >&2
start=$(date +%s)
minor=${kube#*.}
minor=${minor%%.*}
# One go build for both binaries, so that the packages they share compile
# once and the two links run in parallel. The version is stamped the way
# the Kubernetes release build does it, so the server reports v$kube.
ldflags="-s -w"
for kv in gitVersion=v$kube gitMajor=${kube%%.*} gitMinor=$minor gitTreeState=clean; do
  ldflags="$ldflags -X k8s.io/component-base/version.$kv"
done
# Without optimisation or inlining (-N -l) the build takes about 15% less CPU;
# the servers only answer a test's requests, so their speed does not matter.
# -v lists each package as it is compiled; instead of those thousands of
# lines, a line every tenth of the way says how far the build is. Any other
# line (an error, "go: downloading ...") passes through.
total=$(cd "$mod" && go list -deps tool | wc -l)
(cd "$mod" && go build -v -trimpath -gcflags='all=-N -l' -ldflags="$ldflags" -o "$tmp/" tool) 2>&1 |
  awk -v total="$total" -v start="$start" '
    /^[A-Za-z0-9._~\/+-]+$/ {
      n++
      if (n * 10 >= (step + 1) * total && step < 9) {
        step = int(n * 10 / total)
        "date +%s" | getline now
        close("date +%s")
        printf "kube-assets: %d%% (%d of about %d packages compiled, %ds)\n", step * 10, n, total, now - start
        fflush()
      }
      next
    }
    { print; fflush() }' >&2
# go names a main package whose path ends in a major version after the
# element before it: go.etcd.io/etcd/server/v3 builds as "server".
mv "$tmp/server" "$dir/etcd"
mv "$tmp/kube-apiserver" "$dir/kube-apiserver"
echo "kube-assets: built in $(($(date +%s) - start))s" >&2
echo "$dir"
