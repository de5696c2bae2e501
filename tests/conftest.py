"""Shared fixtures: small configs built through the real parser."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.core.config import Config, parse_config


def base_config_dict(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "default_cluster": "a",
        "clusters": [
            {"name": "a", "address": "127.0.0.1:9001", "models": ["m"]},
            {"name": "b", "address": "127.0.0.1:9002", "models": ["m"]},
            {"name": "c", "address": "127.0.0.1:9003", "models": {"m": "m-upstream"}},
        ],
        "models": [{"name": "m", "candidates": ["a", "b", "c"]}],
    }
    data.update(overrides)
    return data


@pytest.fixture
def config() -> Config:
    return parse_config(base_config_dict(), "test.yaml")
