"""Shared fixtures: small configs built through the real parser."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from sidecar.cli import interrupt_on_sigterm
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


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)  # clean up, as Ctrl-C


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """When a test fails, keep the work directories of the stacks open at that moment
    (sidecar.devtools.harness): fixtures are torn down after the failing test's report,
    and their logs are what a post-mortem reads. Stacks opened later go as usual."""
    outcome = yield
    if outcome.get_result().failed:
        from sidecar.devtools.harness import keep_workdirs

        keep_workdirs()


@pytest.fixture
def config() -> Config:
    return parse_config(base_config_dict(), "test.yaml")


# Debian packages some tests need. `.ci/install-test-tools` installs them (CI and
# `make test`); CI also sets TAILROUTE_REQUIRE_TOOLS=1, so a missing one fails there
# instead of skipping silently.
TOOL_PACKAGES = {"promtool": "prometheus", "chromium": "chromium",
                 "redis-server": "redis-server"}


def need_tool(tool: str) -> str:
    """The path of ``tool``; skips the test (fails under TAILROUTE_REQUIRE_TOOLS) if absent."""
    import os
    import shutil

    path = shutil.which(tool)
    if path is None:
        package = TOOL_PACKAGES.get(tool, tool)
        why = f"{tool} not installed (Debian: apt-get install -y {package})"
        if os.environ.get("TAILROUTE_REQUIRE_TOOLS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return path


@pytest.fixture
def redis_tool() -> None:
    """A real redis-server (or valkey-server) for the fleet-mode tests, else skip/fail."""
    from sidecar.devtools.redis_server import redis_binary

    if redis_binary() is None:
        need_tool("redis-server")
