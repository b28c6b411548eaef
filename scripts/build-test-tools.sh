#!/usr/bin/env bash
# Builds the Go helper programs the tests drive, offline, against Debian's Go sources.
# GOPATH mode (GO111MODULE=off) resolves imports from /usr/share/gocode/src, where Debian's
# golang-*-dev packages install; module mode would try to reach the network.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null; then
  echo "build-test-tools: go not found (Debian package golang-go); skipping" >&2
  exit 0
fi

export GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOPROXY=off
export GOCACHE="${GOCACHE:-${TMPDIR:-/tmp}/starling-gocache}"

tool=test-tools/estargz-conformance
if [ ! -d /usr/share/gocode/src/github.com/containerd/stargz-snapshotter/estargz ]; then
  echo "build-test-tools: golang-github-containerd-stargz-snapshotter-dev missing; skipping $tool" >&2
  exit 0
fi
(cd "$tool" && go build -o bin/estargz-conformance .)
echo "built $tool/bin/estargz-conformance"
