"""A fleet URL's credentials never reach a log line or an error message."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sidecar.core.config import ConfigError, parse_config
from sidecar.core.hostport import redacted
from sidecar.fleet.link import FleetLink
from sidecar.shell.app import App
from tests.conftest import base_config_dict


@pytest.mark.parametrize(
    ("url", "shown"),
    [("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
     ("redis://:s3cret@127.0.0.1:6379/0", "redis://***@127.0.0.1:6379/0"),
     ("rediss://user:s3cret@cache.internal:6380", "rediss://***@cache.internal:6380"),
     ("redis://user@[::1]:6379/2", "redis://***@[::1]:6379/2"),
     ("redis://u:p@ss@h:1/0", "redis://***@h:1/0"),  # an '@' in the password
     ("unix:///run/redis.sock", "unix:///run/redis.sock"),
     ("unix:///run/redis.sock?password=s3cret&db=1", "unix:///run/redis.sock?password=***&db=1"),
     ("redis://h:1/0?username=u&password=p", "redis://h:1/0?username=***&password=***"),
     ("redis://a:b@h:1/0?password=p", "redis://***@h:1/0?password=***"),
     ("not a url", "not a url")],
)
def test_redacted(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_fleet_logs_never_show_the_password(caplog: pytest.LogCaptureFixture) -> None:
    cfg = parse_config(base_config_dict(fleet={"url": "redis://admin:s3cret@127.0.0.1:1/0"}),
                       "t.yaml")
    assert cfg.fleet is not None

    async def main() -> None:
        link = FleetLink(App.create(cfg, seed=1), cfg.fleet, rid="r0")
        link._came_up()
        link._went_down(ConnectionError("refused"))
        link._came_up()
        await link.close()

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "sharing through redis://***@127.0.0.1:1/0" in text
    assert "unreachable" in text and "back after" in text and "s3cret" not in text


def test_a_config_error_about_the_url_hides_the_password() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(base_config_dict(fleet={"url": "http://admin:s3cret@h:1"}), "t.yaml")
    assert "fleet.url" in str(err.value) and "s3cret" not in str(err.value)
