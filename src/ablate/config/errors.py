"""What a configuration that cannot run raises, and the one way validation raises it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the allowed values."""


class ExperimentError(ValueError):
    """An experiment file, or the runs it gives, that cannot load; the message names the file (and line)."""


def require(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{field_name}: {message}")
