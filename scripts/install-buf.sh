#!/usr/bin/env bash
# Make buf available in .tools/bin for the wire-contract checks (buf lint, buf breaking).
#
# Usage: scripts/install-buf.sh [DEST]      (DEST defaults to <repo>/.tools)
#
# buf is not packaged by Debian, and the only registries this project may use are PyPI, Debian
# and npm. The npm package @bufbuild/buf installs its binary from a per-platform package
# (@bufbuild/buf-linux-x64, ...) that ships bin/buf; `npm pack` fetches that tarball through npm
# itself and we keep only the binary (no node_modules, no postinstall script run). Idempotent: a
# buf of the pinned version already in DEST/bin is kept.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-${root}/.tools}"
# Pinned: a new buf could add a lint rule or a breaking check and fail an unchanged contract.
version="1.75.0"

say() { echo "install-buf: $*"; }

if [[ -x "${dest}/bin/buf" && "$("${dest}/bin/buf" --version 2>/dev/null)" == "${version}" ]]; then
    say "buf ${version} already in ${dest}/bin; nothing to do"
    exit 0
fi

case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) platform="linux-x64" ;;
    Linux-aarch64 | Linux-arm64) platform="linux-aarch64" ;;
    Darwin-arm64) platform="darwin-arm64" ;;
    Darwin-x86_64) platform="darwin-x64" ;;
    *) echo "install-buf: no @bufbuild/buf package for $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac
package="@bufbuild/buf-${platform}@${version}"

if ! command -v npm >/dev/null; then
    if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null; then
        say "npm not found; installing Debian's npm with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm
    else
        echo "install-buf: npm is required (it fetches ${package}); install npm first" >&2
        exit 1
    fi
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

say "fetching ${package} with npm pack"
(cd "${work}" && npm pack --silent "${package}" >/dev/null)
tar -xzf "${work}"/*.tgz -C "${work}"
if [[ ! -f "${work}/package/bin/buf" ]]; then
    echo "install-buf: ${package} has no bin/buf; the package layout changed" >&2
    exit 1
fi
mkdir -p "${dest}/bin"
install -m 0755 "${work}/package/bin/buf" "${dest}/bin/buf"
say "installed buf $("${dest}/bin/buf" --version) into ${dest}/bin"
