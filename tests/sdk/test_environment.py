"""The connection settings a client reads from the environment (sdk/environment.py): the rules
on plain dictionaries, no server (tests/auth/test_client_environment.py runs them against one)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from coordinator.errors import InvalidArgument
from coordinator.sdk.environment import DEFAULT_TARGET, connection

TOKEN = "tok-from-env"


def test_every_setting_not_passed_comes_from_the_environment() -> None:
    chosen = connection(
        None,
        token=None,
        credentials=None,
        environ={"COORDINATOR_TARGET": "10.0.0.9:7070", "COORDINATOR_TOKEN": TOKEN},
    )
    assert (chosen.target, chosen.token, chosen.credentials) == ("10.0.0.9:7070", TOKEN, None)


def test_nothing_set_is_the_local_default_without_credentials() -> None:
    chosen = connection(None, token=None, credentials=None, environ={})
    assert (chosen.target, chosen.token, chosen.credentials) == (DEFAULT_TARGET, None, None)


def test_an_argument_wins_over_its_variable() -> None:
    environ = {"COORDINATOR_TARGET": "10.0.0.9:7070", "COORDINATOR_TOKEN": TOKEN}
    chosen = connection("127.0.0.1:9", token="tok-explicit", credentials=None, environ=environ)
    assert (chosen.target, chosen.token) == ("127.0.0.1:9", "tok-explicit")
    # A token sent by the caller's own interceptor counts as passed: no second token.
    chosen = connection(None, token=None, credentials=None, token_given=True, environ=environ)
    assert chosen.token is None


def test_explicit_credentials_leave_the_tls_variables_unread(tmp_path: Path) -> None:
    mine = grpc.ssl_channel_credentials()
    environ = {"COORDINATOR_CA": str(tmp_path / "missing.pem"), "COORDINATOR_TOKEN": TOKEN}
    chosen = connection(None, token=None, credentials=mine, environ=environ)
    assert chosen.credentials is mine and chosen.token == TOKEN  # the token is its own setting


def test_a_ca_variable_turns_tls_on_and_an_unreadable_one_is_named(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not really a certificate, grpc reads it lazily")
    chosen = connection(None, token=None, credentials=None, environ={"COORDINATOR_CA": str(ca)})
    assert isinstance(chosen.credentials, grpc.ChannelCredentials)
    with pytest.raises(InvalidArgument) as refused:
        connection(None, token=None, credentials=None, environ={"COORDINATOR_CA": "/nope.pem"})
    assert "the environment variable COORDINATOR_CA" in str(refused.value)


def test_no_credentials_and_a_token_contradict_each_other_naming_both_variables() -> None:
    environ = {"COORDINATOR_INSECURE": "1", "COORDINATOR_TOKEN": TOKEN}
    with pytest.raises(InvalidArgument) as refused:
        connection(None, token=None, credentials=None, environ=environ)
    assert str(refused.value) == (
        "the environment variable COORDINATOR_INSECURE says to send no credentials, but the "
        "environment variable COORDINATOR_TOKEN gives some: drop one of them"
    )
    # A token passed by the caller is the caller's choice: the leftover variable is not read.
    chosen = connection(None, token="tok-explicit", credentials=None, environ=environ)
    assert chosen.token == "tok-explicit"
    # Set to false, it says nothing.
    chosen = connection(
        None, token=None, credentials=None, environ={**environ, "COORDINATOR_INSECURE": "0"}
    )
    assert chosen.token == TOKEN


def test_a_client_certificate_without_its_key_is_refused_naming_it() -> None:
    with pytest.raises(InvalidArgument) as refused:
        connection(None, token=None, credentials=None, environ={"COORDINATOR_CLIENT_CERT": "c.pem"})
    assert str(refused.value) == (
        "a client certificate and its key go together, but only the environment variable "
        "COORDINATOR_CLIENT_CERT is set"
    )


def test_a_boolean_variable_that_is_neither_is_refused_naming_it() -> None:
    with pytest.raises(InvalidArgument) as refused:
        connection(None, token=None, credentials=None, environ={"COORDINATOR_INSECURE": "maybe"})
    assert str(refused.value) == (
        "the environment variable COORDINATOR_INSECURE: 'maybe' is not a boolean (1 or 0)"
    )


def test_the_token_may_come_from_the_file_a_variable_names(tmp_path: Path) -> None:
    """The chart mounts the pool's token as a file and names it in COORDINATOR_CLIENT_TOKEN_FILE."""
    token_file = tmp_path / "token"
    token_file.write_text("tok-from-file\n")
    environ = {"COORDINATOR_CLIENT_TOKEN_FILE": str(token_file)}
    assert connection(None, token=None, credentials=None, environ=environ).token == "tok-from-file"
    # The variable itself wins over the file, an argument over both.
    both = {**environ, "COORDINATOR_TOKEN": TOKEN}
    assert connection(None, token=None, credentials=None, environ=both).token == TOKEN
    assert connection(None, token="mine", credentials=None, environ=both).token == "mine"
    # A token from the file contradicts COORDINATOR_INSECURE like any other, naming the file.
    with pytest.raises(InvalidArgument) as refused:
        connection(
            None, token=None, credentials=None, environ={**environ, "COORDINATOR_INSECURE": "1"}
        )
    assert f"the file COORDINATOR_CLIENT_TOKEN_FILE names ({token_file})" in str(refused.value)
    missing = {"COORDINATOR_CLIENT_TOKEN_FILE": str(tmp_path / "nope")}
    with pytest.raises(InvalidArgument) as refused:
        connection(None, token=None, credentials=None, environ=missing)
    assert "the environment variable COORDINATOR_CLIENT_TOKEN_FILE" in str(refused.value)
