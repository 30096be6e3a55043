#!/usr/bin/env bash
# Headless Chromium for the console's browser tests (tests/console/test_browser.py): Debian's
# `chromium` and `chromium-driver`, driven by selenium. Never fails the build without them: the
# browser tests then report themselves SKIPPED with the reason. Installs with apt-get as root
# only; otherwise it says what is missing and exits 0.
set -uo pipefail

say() { echo "install-browser: $*"; }

missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)

if [[ ${#missing[@]} -eq 0 ]]; then
    say "chromium and chromedriver already installed; nothing to do"
    exit 0
fi
if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} with apt-get"
    if DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; then
        exit 0
    fi
fi
say "${missing[*]} not installed: the console's browser tests will be SKIPPED"
exit 0
