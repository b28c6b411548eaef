#!/usr/bin/env bash
# The whole test suite: Debian packages, npm packages, build, then every test file,
# run by node's test runner against real registries, containerd, skopeo and podman.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
npm ci --no-audit --no-fund
npm run build
# Every area type-checked and linted (ESLint, knip, Prettier) before any test runs; either fails the run.
npm run typecheck
npm run lint

# Helper programs the tests drive (built from this repository's own sources).
if [ -x scripts/build-test-tools.sh ]; then bash scripts/build-test-tools.sh; fi

# node --test given a folder finds no .ts files on Node 20: name every file explicitly.
mapfile -t files < <(find test -name '*.test.ts' -not -path '*/node_modules/*' | sort)
if ((${#files[@]} == 0)); then
  echo "no test files found" >&2
  exit 1
fi
echo "running ${#files[@]} test files"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
node --import tsx --test --test-concurrency=1 --test-reporter=spec "${files[@]}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

tests=$(grep -aE '^ℹ tests [0-9]+' "$log" | tail -1 | awk '{print $3}')
if [ -z "${tests:-}" ] || [ "$tests" -eq 0 ]; then
  echo "test runner reported no tests" >&2
  exit 1
fi
exit "$status"
