#!/usr/bin/env bash
# Runs omnipd's whole test suite: formatting, go vet, every test (with the
# race detector) including the fault-injection suite, a short soak and the
# Kubernetes manifests against a real kube-apiserver, and short fuzzes of
# the config loader, the request decoder, the SSE reader, the generic JSON
# decoder and the KV ticket parser. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# Fuzz time per target; CI keeps it short, raise it locally to dig deeper.
FUZZTIME="${FUZZTIME:-10s}"

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

# Real etcd and kube-apiserver binaries for kube/kubetest, built once into a
# cache directory keyed by their versions (skipped when already there). The
# cold build takes minutes, so it runs beside vet and the other tests.
echo "== kube-apiserver and etcd for kube/kubetest (in the background)"
assets_out=$(mktemp)
./scripts/kube-assets.sh >"$assets_out" &
assets_pid=$!
trap 'kill "$assets_pid" 2>/dev/null || true; rm -f "$assets_out"' EXIT

echo "== go vet"
go vet ./...

echo "== go test -race (all but kube/kubetest)"
go test -race -count=1 $(go list ./... | grep -v '/kube/kubetest$')

echo "== go test -race ./kube/kubetest (waiting for its binaries)"
wait "$assets_pid"
OMNIPD_KUBE_ASSETS="$(cat "$assets_out")"
export OMNIPD_KUBE_ASSETS
go test -race -count=1 ./kube/kubetest

echo "== fuzz the deploy config loader ($FUZZTIME)"
go test -run='^$' -fuzz='^FuzzLoad$' -fuzztime="$FUZZTIME" ./deploy

echo "== fuzz the request decoder ($FUZZTIME)"
go test -run='^$' -fuzz='^FuzzDecodeRequest$' -fuzztime="$FUZZTIME" ./openai

echo "== fuzz the SSE reader ($FUZZTIME)"
go test -run='^$' -fuzz='^FuzzSSEReader$' -fuzztime="$FUZZTIME" ./openai

echo "== fuzz the generic JSON decoder against encoding/json ($FUZZTIME)"
go test -run='^$' -fuzz='^FuzzGenericValue$' -fuzztime="$FUZZTIME" ./openai

echo "== fuzz the KV ticket parser ($FUZZTIME)"
go test -run='^$' -fuzz='^FuzzParseTicket$' -fuzztime="$FUZZTIME" ./kvtransfer
