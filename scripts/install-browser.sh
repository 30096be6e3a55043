#!/usr/bin/env bash
# Headless Chromium for the console's browser tests (tests/console/test_browser.py): Debian's
# `chromium` and `chromium-driver`, driven by selenium. Installs with apt-get as root only.
#
# On a developer machine a missing browser never fails the build: the browser tests then report
# themselves SKIPPED with the reason. In CI (CI set, as CI runs `CI=true bash .ci/run`) it does:
# the script exits 1, and the tests would fail rather than skip, so a runner without a browser
# can never pass with the browser tests quietly skipped.
set -uo pipefail

say() { echo "install-browser: $*"; }

required() {
    case "${CI:-}" in
        "" | 0 | false | no) return 1 ;;
        *) return 0 ;;
    esac
}

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
if required; then
    say "${missing[*]} not installed and CI is set: the console's browser tests must run here" >&2
    say "install Debian's chromium and chromium-driver (as root: apt-get install chromium chromium-driver)" >&2
    exit 1
fi
say "${missing[*]} not installed: the console's browser tests will be SKIPPED"
exit 0
