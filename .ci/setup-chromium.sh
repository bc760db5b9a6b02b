#!/usr/bin/env bash
# Make Debian's chromium available for the browser tests (Playwright drives
# /usr/bin/chromium; it never downloads a browser of its own). Idempotent and
# quiet: does nothing when /usr/bin/chromium is already there. Needs root for
# apt-get. Prints the browser's path.
set -euo pipefail

browser=/usr/bin/chromium
if [ ! -x "$browser" ]; then
  log=$(mktemp)
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core; } >"$log" 2>&1; then
    echo "setup-chromium: apt-get install chromium failed:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  rm -f "$log"
  [ -x "$browser" ] || { echo "setup-chromium: chromium installed but $browser not found" >&2; exit 1; }
fi
echo "$browser"
