#!/usr/bin/env bash
# Optional tools of two chaos faults (chaos/faults.py); never fails the build without them:
#   clock-skew        needs libfaketime  (Debian package `faketime`)
#   worker-partition  needs `ip netns`   (Debian package `iproute2`) and root
# Without them the scenarios report themselves SKIPPED with the reason. Installs with apt-get
# as root only; otherwise it says what is missing and exits 0.
set -uo pipefail

say() { echo "install-chaos-tools: $*"; }

missing=()
[[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 || -e /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1 || -e /usr/lib/faketime/libfaketime.so.1 ]] || missing+=(faketime)
command -v ip >/dev/null || missing+=(iproute2)

if [[ ${#missing[@]} -eq 0 ]]; then
    say "faketime and ip already installed; nothing to do"
    exit 0
fi
if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} with apt-get"
    if DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; then
        exit 0
    fi
fi
say "${missing[*]} not installed: the chaos scenarios that need them will be SKIPPED"
exit 0
