"""The TOML config file of ``coordinator serve --config``: its keys are the settings (Config's
fields), its values are checked later exactly like flags and environment variables."""

from __future__ import annotations

import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from coordinator.config import Config
from coordinator.errors import ConfigError

TABLE_SETTINGS = frozenset({"retention_per_queue"})
"""Settings a config file gives as a TOML table."""

SETTINGS: tuple[str, ...] = tuple(f.name for f in fields(Config))
"""Every setting's name (Config's fields): the keys a config file may use."""


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The settings in a TOML config file; ConfigError naming the file or the unknown key.

    Keys are setting names (``max_ttl = 60``, ``etcd = ["a:2379", "b:2379"]``); values are
    checked later, exactly like flags and environment variables.
    """
    try:
        with Path(path).open("rb") as handle:
            doc = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"config: cannot read {str(path)!r}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {str(path)!r} is not valid TOML: {exc}") from exc
    for key, value in doc.items():
        if key not in SETTINGS:
            raise ConfigError(f"config: unknown setting {key!r} in {str(path)!r}")
        if isinstance(value, dict) and key not in TABLE_SETTINGS:
            raise ConfigError(f"config: {key} must be a value, not a table")
    return doc
