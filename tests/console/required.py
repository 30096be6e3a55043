"""When the browser tests may be skipped: on a developer machine without a browser, yes, with
the reason; in CI, never (a runner without chromium must fail, not pass with them skipped)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def browser_required() -> bool:
    """Whether a missing browser fails the run: in CI (``CI`` set to anything but empty, 0,
    false or no), the browser tests must run."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str, *, module: bool = False) -> NoReturn:
    """Skip with ``reason``, or fail in CI."""
    if browser_required():
        pytest.fail(
            f"{reason}; CI is set, so the console's browser tests must run here "
            "(scripts/install-browser.sh installs chromium and chromium-driver as root)",
            pytrace=False,
        )
    pytest.skip(reason, allow_module_level=module)
