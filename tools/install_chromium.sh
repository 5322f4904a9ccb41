#!/usr/bin/env bash
# Debian's chromium for the browser test (tests/test_browser.py drives it with Python playwright;
# `playwright install` downloads browsers and is not used). Idempotent: nothing to do if present.
set -euo pipefail
CHROMIUM=${JDIST_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "tools/install_chromium.sh: no $CHROMIUM and no apt-get; the browser test will be skipped" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  SUDO="sudo"
fi
echo "== Installing Debian chromium for the browser test =="
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium
