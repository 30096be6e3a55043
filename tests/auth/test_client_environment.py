"""Both SDK clients read the CLI's ``COORDINATOR_*`` environment (sdk/environment.py): the
README's worker, given no target or token, works against a server that demands tokens."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.errors import Unauthenticated
from coordinator.sdk import CallRetry, WorkerClient
from coordinator.sdk.aio import AsyncWorkerClient
from tests.auth.conftest import TokenRing
from tests.conftest import GRPC_OPTIONS

ONE_TRY = CallRetry(attempts=1)


def test_the_sync_client_takes_target_and_token_from_the_environment(
    secured: str, ring: TokenRing, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COORDINATOR_TARGET", secured)
    monkeypatch.setenv("COORDINATOR_TOKEN", ring.tokens["pm-1"])
    with WorkerClient(principal="ignored", channel_options=GRPC_OPTIONS, retry=ONE_TRY) as client:
        created = client.create_task("env-1", input=b"x")
        assert created.task_id == "env-1"
    # An explicit token wins over the variable: a revoked one is refused.
    revoked = ring.revoke("admin-1")
    with (
        WorkerClient(
            principal="ignored", token=revoked, channel_options=GRPC_OPTIONS, retry=ONE_TRY
        ) as client,
        pytest.raises(Unauthenticated),
    ):
        client.get_task("env-1")


def test_the_async_client_takes_target_and_token_from_the_environment(
    secured: str, ring: TokenRing, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COORDINATOR_TARGET", secured)
    monkeypatch.setenv("COORDINATOR_TOKEN", ring.tokens["pm-1"])

    async def create() -> str:
        async with AsyncWorkerClient(
            principal="ignored", channel_options=GRPC_OPTIONS, retry=ONE_TRY
        ) as client:
            return (await client.create_task("env-2", input=b"x")).task_id

    assert asyncio.run(create()) == "env-2"


def test_without_the_token_variable_the_server_refuses(
    secured: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COORDINATOR_TARGET", secured)
    monkeypatch.delenv("COORDINATOR_TOKEN", raising=False)
    with (
        WorkerClient(principal="pm-1", channel_options=GRPC_OPTIONS, retry=ONE_TRY) as client,
        pytest.raises(Unauthenticated),
    ):
        client.epoch()
