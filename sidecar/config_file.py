"""Read a config file from disk (the only I/O around config parsing)."""

from __future__ import annotations

from pathlib import Path

import yaml

from sidecar.core.config import Config, ConfigError, parse_config


def load_config(path: str | Path) -> Config:
    """Load and validate ``path``; raises :class:`ConfigError` naming the file and field."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{p}: {where}invalid YAML: {problem}") from None
    return parse_config(data, str(p))
