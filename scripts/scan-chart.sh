#!/usr/bin/env bash
# Policy scan of the rendered chart: checkov's Kubernetes checks over `helm template` of every
# helm/coordinator/ci/*-values.yaml. Accepted checks, with the reason for each, are listed in
# helm/coordinator/ci/checkov.yaml; any other finding fails the scan.
#
# Usage: scripts/scan-chart.sh [TOOLS]        (TOOLS defaults to <repo>/.tools, where helm is)
#
# checkov lives in its own venv (TOOLS/checkov, pinned): its many pinned dependencies must not
# meet the project's. It is run with --skip-download and, where the kernel lets root make one,
# inside an empty network namespace: the scan is local and must never reach the network.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
tools="${1:-${root}/.tools}"
version="3.3.30"
checkov="${tools}/checkov/bin/checkov"

say() { echo "scan-chart: $*"; }

if ! "${checkov}" --version 2>/dev/null | grep -qx "${version}"; then
    say "installing checkov ${version} into ${tools}/checkov"
    python3 -m venv "${tools}/checkov"
    "${tools}/checkov/bin/python" -m pip install -q "checkov==${version}"
fi

rendered="$(mktemp -d)"
trap 'rm -rf "${rendered}"' EXIT
for values in "${root}"/helm/coordinator/ci/*-values.yaml; do
    "${tools}/bin/helm" template ci "${root}/helm/coordinator" -f "${values}" \
        >"${rendered}/$(basename "${values}" -values.yaml).yaml"
done

isolate=()
if unshare --net true 2>/dev/null; then
    isolate=(unshare --net)
fi
say "checkov over $(ls "${rendered}" | wc -l) rendered values files"
BC_SKIP_MAPPING=TRUE "${isolate[@]}" "${checkov}" --directory "${rendered}" \
    --config-file "${root}/helm/coordinator/ci/checkov.yaml" \
    --skip-download --compact --quiet
