#!/usr/bin/env bash
# The project's test command: installs redis-server and redis-cli when they
# are missing (the tests start their own servers and cluster on free loopback
# ports), checks formatting and vet, then runs every test with the race
# detector, in random order, uncached.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-redis.sh

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
if [ -f bench/go.mod ]; then
  # The benchmark module must keep compiling; its benchmarks are run by hand
  # (BENCHMARKS.md). Checked first, so that the test run below ends the output.
  (cd bench && go vet ./... && go test -count=1 -run '^$' ./... >/dev/null)
fi
go test -race -shuffle=on -count=1 -p 1 -timeout 20m ./...
