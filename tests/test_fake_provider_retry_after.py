"""The fake provider's rate limit that declares its wait: ``retry_after`` /
``retry_after_ms`` sent verbatim with every ``error_rate`` answer."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from sidecar.fake_provider.latency import ConfigError, Profile
from sidecar.fake_provider.server import main
from tests.test_fake_provider import MSGS, async_test, control, serving


@pytest.mark.parametrize(("value", "sent"), [
    (None, None),
    (2, "2"),
    (2.0, "2"),
    (1.5, "1.5"),
    ("1500", "1500"),
    ("Wed, 21 Oct 2015 07:28:00 GMT", "Wed, 21 Oct 2015 07:28:00 GMT"),
    ("soon", "soon"),  # garbage on purpose: what the sidecar must survive
    ("-3", "-3"),
])
@pytest.mark.parametrize("key", ["retry_after", "retry_after_ms"])
def test_a_header_value_is_kept_as_it_is_sent(key: str, value: object,
                                              sent: str | None) -> None:
    prof = Profile().updated({key: value})
    assert getattr(prof, key) == sent
    assert Profile().updated(prof.to_json()) == prof


@pytest.mark.parametrize("value", [
    "a\r\nx-injected: 1", "caf\u00e9", "x" * 257, float("nan"), float("inf"), True, [1], {},
])
def test_a_value_that_cannot_be_a_header_is_refused(value: Any) -> None:
    with pytest.raises(ConfigError, match="retry_after"):
        Profile().updated({"retry_after": value})


@async_test
async def test_a_429_declares_its_wait_and_other_answers_do_not() -> None:
    async with serving(name="rl") as (provider, client):
        await control(provider.port, {"error_rate": 1.0, "error_status": 429,
                                      "retry_after": 2, "retry_after_ms": "1500"})
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(model="m", messages=MSGS)
        headers = info.value.response.headers
        assert headers["retry-after"] == "2" and headers["retry-after-ms"] == "1500"
        await control(provider.port, {"retry_after_ms": None})
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(model="m", messages=MSGS)
        assert "retry-after-ms" not in info.value.response.headers
        await control(provider.port, {"error_rate": 0.0})
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=MSGS)
        assert "retry-after" not in raw.headers
        assert provider.status_counts == {429: 2, 200: 1}


@pytest.mark.parametrize("argv", [
    ["--retry-after", "a\nb"],
    ["--error-status", "200"],
])
def test_the_command_line_refuses_a_bad_value(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
