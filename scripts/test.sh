#!/usr/bin/env bash
# Runs omnipd's whole test suite: formatting, go vet, every test (with the
# race detector), and a short fuzz of the config loader. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# Fuzz time per target; CI keeps it short, raise it locally to dig deeper.
FUZZTIME="${FUZZTIME:-15s}"

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

echo "== go vet"
go vet ./...

# Real etcd and kube-apiserver binaries for kube/kubetest, built once into a
# cache directory keyed by their versions (skipped when already there).
echo "== kube-apiserver and etcd for kube/kubetest"
OMNIPD_KUBE_ASSETS="$(./scripts/kube-assets.sh)"
export OMNIPD_KUBE_ASSETS

echo "== go test -race"
go test -race -count=1 ./...

echo "== fuzz the deploy config loader ($FUZZTIME)"
go test -run='^$' -fuzz='^FuzzLoad$' -fuzztime="$FUZZTIME" ./deploy
