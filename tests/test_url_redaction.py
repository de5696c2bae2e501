"""A fleet URL's credentials never reach a log line or an error message, whatever
characters they hold, and a URL the Redis client would misread is a config error."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st
from redis.connection import parse_url

from sidecar.core.config import ConfigError, parse_config
from sidecar.core.store_url import redacted
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
     # '/', '?', '#' or ':' in it, unencoded (the config refuses the first three, but the
     # refusal must not show it either)
     ("redis://u:pa/ss@h:1/0", "redis://***@h:1/0"),
     ("redis://u:pa?ss@h:1/0", "redis://***@h:1/0"),
     ("redis://u:pa#ss@h:1/0", "redis://***@h:1/0"),
     ("redis://:a:b@h:1/0", "redis://***@h:1/0"),
     ("redis://u:p%2Fss@h:1/0", "redis://***@h:1/0"),
     ("redis:u:pw@h:1/0", "redis:***@h:1/0"),  # a mistyped scheme (the config error shows it)
     ("unix:///run/redis.sock?pass%77ord=s3cret", "unix:///run/redis.sock?pass%77ord=***"),
     ("unix:///run/redis.sock?PASSWORD=s3cret;db=1", "unix:///run/redis.sock?PASSWORD=***;db=1"),
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


_HOSTS = st.sampled_from(["127.0.0.1", "cache.internal", "[::1]", "redis-0.redis"])


@given(user=st.text(max_size=12), password=st.text(min_size=1, max_size=24), host=_HOSTS)
@example(user="app", password="pa/ss", host="h")
@example(user="", password="12/34", host="h")  # once read as host '', port 12
def test_no_spelling_of_the_credentials_survives_redaction(user: str, password: str,
                                                           host: str) -> None:
    """Written as they are or percent-encoded, in the user part or the query."""
    shown = f"redis://***@{host}:6379/0"
    assert redacted(f"redis://{user}:{password}@{host}:6379/0") == shown
    assert redacted(f"rediss://{quote(user, safe='')}:{quote(password, safe='')}"
                    f"@{host}:6379/0") == "rediss" + shown[5:]
    query = f"db=1&password={quote(password, safe='')}&username={quote(user, safe='')}"
    assert redacted(f"unix:///run/r.sock?{query}") == (
        "unix:///run/r.sock?db=1&password=***&username=***")


@given(password=st.text(min_size=6, max_size=24).filter(
    lambda p: p not in "redis://app:@127.0.0.1:6379/0 fleet.url t.yaml"))
@example(password="pa/ss/word")
@example(password="12/345678")
@example(password="ab?cd#ef")
@example(password="pa\uff0fss12")  # a fullwidth '/': urlsplit's error quoted the host part
@example(password="pass\tword")
@example(password="0000[]")  # urlsplit checks "[...]" anywhere in the authority as IPv6
def test_a_config_that_passes_is_read_by_the_client_as_written(password: str) -> None:
    """check-config never passes a URL the Redis client misreads (``serve`` used to
    stop with a traceback quoting part of the password), and its error never shows it."""
    url = f"redis://app:{password}@127.0.0.1:6379/0"
    try:
        parse_config(base_config_dict(fleet={"url": url}), "t.yaml")
    except ConfigError as err:
        assert "fleet.url: cannot be read as a Redis URL" in str(err)
        assert password not in str(err)
        return
    got = parse_url(url)  # what RedisStore hands the client
    assert (got["host"], got["port"], got["username"]) == ("127.0.0.1", 6379, "app")


@pytest.mark.parametrize(("url", "problem"), [
    ("redis://app:pa/ss@127.0.0.1:6379/0", "an '@' after the host"),
    ("redis://app:12#34@127.0.0.1:6379/0", "an '@' after the host"),
    ("redis://127.0.0.1:63x9/0", "a port that is not a number"),
    ("redis://127.0.0.1:70000/0", "a port that is not a number"),
    ("redis://[::1/0", "or an unmatched one"),
    ("redis://[fe80::zz]:6379/0", "a malformed [IPv6] host"),
    ("redis://app:pa\uff0fss@127.0.0.1:6379/0", "once normalised"),  # urlsplit quoted it
    ("redis://app:pa[ss@127.0.0.1:6379/0", "a '[' or ']' in the user name"),
    ("redis://app:0000[]@127.0.0.1:6379/0", "a '[' or ']' in the user name"),
    # The client read a path that is no number as database 0, silently.
    ("redis://127.0.0.1:6379/abc", "a database (the path, or ?db=) that is not a number"),
    ("redis://127.0.0.1:6379/-1", "a database (the path, or ?db=) that is not a number"),
    ("unix:///run/r.sock?db=one", "a database (the path, or ?db=) that is not a number"),
])
def test_a_url_the_client_would_misread_is_a_config_error(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(base_config_dict(fleet={"url": url}), "t.yaml")
    assert "t.yaml: fleet.url: cannot be read as a Redis URL" in str(err.value)
    assert problem in str(err.value) and "pa/ss" not in str(err.value)


@pytest.mark.parametrize("url", ["redis://app:p%2Fss@127.0.0.1:6379/0", "redis://[::1]:6379/0",
                                 "rediss://u:p@ss@cache:6380", "unix:///run/r.sock?db=1",
                                 "redis://:a:b@h/0"])
def test_urls_the_client_reads_as_written_pass(url: str) -> None:
    cfg = parse_config(base_config_dict(fleet={"url": url}), "t.yaml")
    assert cfg.fleet is not None and cfg.fleet.url == url


@pytest.mark.parametrize(("query", "problem"), [
    ("socket_timeout=abc", "Invalid value for 'socket_timeout' in connection URL."),
    ("protocol=9", "protocol must be either 2 or 3"),
    ("foo=1", "it takes no query argument 'foo' with redis://"),
])
def test_what_the_client_refuses_is_a_config_error_naming_the_file_and_field(
    tmp_path: Path, query: str, problem: str,
) -> None:
    """Before, check-config passed these; ``serve`` then stopped with a traceback
    (socket_timeout) or logged the store "unreachable" at every retry (the others)."""
    from sidecar.ops.config_file import load_config

    path = tmp_path / "t.yaml"
    url = f"redis://:s3cret@127.0.0.1:6379/0?{query}"
    path.write_text(yaml.safe_dump(base_config_dict(fleet={"url": url})))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: fleet.url: the Redis client refuses it: "
                                     f"{problem} (line ")
    assert "s3cret" not in str(err.value)


def test_a_tls_query_on_a_tls_url_passes(tmp_path: Path) -> None:
    from sidecar.ops.config_file import load_config

    path = tmp_path / "t.yaml"
    url = "rediss://cache:6380/2?ssl_cert_reqs=required&socket_timeout=0.5"
    path.write_text(yaml.safe_dump(base_config_dict(fleet={"url": url})))
    cfg = load_config(path)
    assert cfg.fleet is not None and cfg.fleet.url == url
