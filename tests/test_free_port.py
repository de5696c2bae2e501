"""The harness's listening ports: free, distinct, and out of the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sidecar.devtools import harness


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low = harness._ephemeral_low()
    ports = [harness.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
        if low is not None and low - harness._LISTEN_SPAN >= 10000:
            assert low - harness._LISTEN_SPAN <= port < low


def test_a_port_taken_by_a_listener_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # a range of one port: the held one, so free_port must fall back to bind(0)
        monkeypatch.setattr(harness, "_LISTEN_SPAN", 1)
        monkeypatch.setattr(harness, "_ephemeral_low", lambda: taken + 1)
        port = harness.free_port()
        assert port != taken


@pytest.mark.parametrize("text", ["", "garbage", "32768"])
def test_ephemeral_low_reads_or_gives_none(tmp_path: Path, text: str) -> None:
    f = tmp_path / "range"
    f.write_text(text)
    got = harness._ephemeral_low(str(f))
    assert got == (32768 if text == "32768" else None)
    assert harness._ephemeral_low(str(tmp_path / "missing")) is None
