"""The console answers only the names it is served under (issue 25 item 6): a page of another
site DNS-rebound to 127.0.0.1 reached an insecure console with its own Host header and signed in
as anyone. Insecure: loopback names only, and never a non-loopback listen address; otherwise the
configured names. A form's Origin must be its Host, so it is held to the same names."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from coordinator.cli import main
from coordinator.console.hosts import HostPolicy, host_name
from tests.console.conftest import console_process


@contextmanager
def _client(args: Sequence[str], tmp_path: Path) -> Iterator[httpx.Client]:
    """A client of a real ``coordinator console ARGS`` (its coordinator need not run: the
    sign-in page calls none)."""
    with (
        console_process(["--target", "127.0.0.1:1", *args], tmp_path) as url,
        httpx.Client(base_url=url, follow_redirects=False) as client,
    ):
        yield client


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8080", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("[::1]:8080", "::1"),
        ("::1", "::1"),
        ("console.example.com:443", "console.example.com"),
    ],
)
def test_host_names_are_read_without_their_port(header: str, name: str) -> None:
    assert host_name(header) == name


def test_the_policy_is_loopback_when_insecure_and_the_configured_names_otherwise() -> None:
    insecure = HostPolicy(insecure=True, allowed=["console.example.com"])
    assert [insecure.allows(n) for n in ("localhost", "127.0.0.1", "::1", "127.0.0.2")] == [
        True
    ] * 4
    assert not insecure.allows("console.example.com")  # configured names never open it
    assert not insecure.allows("evil.example")
    named = HostPolicy(insecure=False, allowed=["Console.Example.com"])
    assert named.allows("console.example.com")
    assert not named.allows("localhost")
    assert HostPolicy(insecure=False).allows("anything.example")


def test_an_insecure_console_refuses_a_rebound_host_and_a_foreign_origin(
    tmp_path: Path,
) -> None:
    with _client(["--insecure"], tmp_path) as client:
        assert client.get("/signin").status_code == 200
        assert client.get("/signin", headers={"host": "localhost"}).status_code == 200
        rebound = client.get("/signin", headers={"host": "evil.example:8080"})
        assert (rebound.status_code, rebound.text) == (
            400,
            "this console does not answer to host 'evil.example'\n",
        )
        form = {"principal": "admin-1", "csrf": "x"}
        foreign = client.post("/signin", data=form, headers={"origin": "http://evil.example"})
        assert (foreign.status_code, foreign.text) == (
            403,
            "refused: the form was posted from another site",
        )
        assert "set-cookie" not in foreign.headers
        rebound_post = client.post("/signin", data=form, headers={"host": "evil.example"})
        assert rebound_post.status_code == 400
        assert "set-cookie" not in rebound_post.headers


def test_a_console_with_allowed_hosts_answers_only_those(tmp_path: Path) -> None:
    with _client(["--allowed-host", "console.example.com"], tmp_path) as client:
        ok = client.get("/signin", headers={"host": "console.example.com"})
        assert ok.status_code == 200
        assert client.get("/signin").status_code == 400  # 127.0.0.1 is not configured


def test_console_insecure_off_loopback_is_refused() -> None:
    result = CliRunner().invoke(
        main,
        ["console", "--insecure", "--target", "127.0.0.1:1", "--listen", "0.0.0.0:0"],
    )
    assert result.exit_code == 2
    assert "--insecure serves a console anyone can sign in to as anyone" in result.output
    assert "not 0.0.0.0:0" in result.output
