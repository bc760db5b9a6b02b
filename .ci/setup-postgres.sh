#!/usr/bin/env bash
# Make PostgreSQL's server binaries available for the store tests (tests/pg.py
# starts its own throwaway cluster from them). Idempotent and quiet: does
# nothing when initdb is already on PATH or in Debian's /usr/lib/postgresql.
# Needs root for apt-get. Prints the bin directory it found.
set -euo pipefail

find_bin() {
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v initdb)")"
    return 0
  fi
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$found" ] && [ -x "$found/initdb" ] && echo "$found"
}

if ! bin=$(find_bin); then
  log=$(mktemp)
  # The package's own "main" cluster is not used; the tests start their own.
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; } >"$log" 2>&1; then
    echo "setup-postgres: apt-get install postgresql failed:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  rm -f "$log"
  bin=$(find_bin) || { echo "setup-postgres: postgresql installed but initdb not found" >&2; exit 1; }
fi

# As root the cluster runs as 'postgres'; Debian's package creates that user.
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
fi
echo "$bin"
