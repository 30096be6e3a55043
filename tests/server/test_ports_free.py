"""coordinator.server.startup.ensure_free: a taken port is a setting to change, found before
the replica touches etcd; what is not a host:port to check is left to the real bind."""

from __future__ import annotations

import socket

import pytest

from coordinator.errors import ConfigError
from coordinator.server.startup import ensure_free


def test_the_first_taken_address_is_named_with_its_setting_and_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as refused:
            ensure_free("127.0.0.1:0", f"127.0.0.1:{port}", f"127.0.0.1:{port}")
    assert str(refused.value).startswith(f"health_listen: cannot bind '127.0.0.1:{port}'")
    assert str(refused.value).endswith(
        "(address already in use): is another process listening there? Stop it or choose "
        "another address (--health-listen / COORDINATOR_HEALTH_LISTEN; port 0 picks a free one)"
    )


@pytest.mark.parametrize(
    "other",
    ["127.0.0.1:0", "unix:/tmp/coordinator.sock", "192.0.2.1:9090"],  # the last: not ours
    ids=["port-0", "unix-socket", "address-not-on-this-machine"],
)
def test_a_free_port_port_zero_none_and_other_forms_pass(other: str) -> None:
    with socket.socket() as held:  # bound, not listening: a closed probe leaves it free
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
    ensure_free(f"127.0.0.1:{port}", None, other)
    with socket.create_server(("127.0.0.1", port)):  # the probe left it bindable
        pass
