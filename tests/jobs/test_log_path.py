"""Where a managed job's log goes: under the log directory, whatever the task id says."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.errors import CoordinatorError
from coordinator.sdk.managed import job_log_path


def test_the_log_goes_under_the_task_directory(tmp_path: Path) -> None:
    assert job_log_path(tmp_path, "t-1", "j-1") == tmp_path.resolve() / "t-1" / "j-1.log"


@pytest.mark.parametrize("task_id", ["..", ".", "../../etc", "a/../..", "/abs", "a/.."])
def test_a_task_id_that_leaves_the_directory_is_refused(tmp_path: Path, task_id: str) -> None:
    logs = tmp_path / "logs"
    with pytest.raises(CoordinatorError) as info:
        job_log_path(logs, task_id, "j-1")
    message = str(info.value)
    assert f"job j-1 of task {task_id!r}" in message
    assert f"is not inside the log directory {str(logs.resolve())!r}" in message


def test_a_symlinked_task_directory_pointing_out_is_refused(tmp_path: Path) -> None:
    logs, outside = tmp_path / "logs", tmp_path / "outside"
    logs.mkdir()
    outside.mkdir()
    (logs / "t-1").symlink_to(outside, target_is_directory=True)
    with pytest.raises(CoordinatorError, match="not inside the log directory"):
        job_log_path(logs, "t-1", "j-1")


def test_a_symlinked_log_directory_itself_is_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    assert job_log_path(tmp_path / "link", "t-1", "j-1") == real.resolve() / "t-1" / "j-1.log"
