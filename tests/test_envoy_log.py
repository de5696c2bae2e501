"""Observations from Envoy access-log entries (pure core) and the wire conversion."""

from __future__ import annotations

import random

import pytest
from google.protobuf import struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.buckets import Buckets
from sidecar.core.envoy_log import (
    CANCEL_FLAGS,
    ERROR_FLAGS,
    TIMEOUT_FLAGS,
    LogRecord,
    observation_from_log,
    outcome_of,
    retried_attempts,
)
from sidecar.core.subwindow import latency_indices
from sidecar.core.ttft_offset import BLIND_OFFSET_S, OffsetBook
from sidecar.core.types import SliceKey
from sidecar.pb.envoy.data.accesslog.v3 import accesslog_pb2 as al
from sidecar.shell.access_log import record_from_entry

S = SliceKey("m", "interactive", "short", True)


@pytest.mark.parametrize(("status", "flags", "details", "outcome"), [
    (200, set(), "via_upstream", "ok"),
    (200, {"downstream_connection_termination"}, "via_upstream", "cancel"),
    (0, {"downstream_remote_reset"}, "", "cancel"),
    (0, set(), "", "cancel"),
    (504, {"upstream_request_timeout"}, "response_timeout", "timeout"),
    (504, set(), "via_upstream", "timeout"),
    (408, set(), "via_upstream", "timeout"),
    (200, {"stream_idle_timeout"}, "", "timeout"),
    (200, set(), "max_duration_timeout", "timeout"),  # a route's max_stream_duration: no flag
    (503, {"upstream_connection_failure"}, "", "error"),
    (503, {"upstream_overflow"}, "", "error"),
    (500, set(), "via_upstream", "error"),
    (429, set(), "via_upstream", "error"),
    (404, set(), "via_upstream", None),
    (429, set(), "tailroute_defer_overload", None),
    (400, set(), "tailroute_invalid_request_error", None),
])
def test_outcome_table(status: int, flags: set[str], details: str, outcome: str | None) -> None:
    assert outcome_of(LogRecord(status=status, flags=frozenset(flags), details=details)) == outcome


DC = frozenset({"downstream_connection_termination"})


@pytest.mark.parametrize(("rec", "outcome"), [
    # The upstream ended the response before the client left: complete.
    (LogRecord(status=200, flags=DC, end_s=0.9), "ok"),
    # The last usage event went through (the SDK closes at [DONE]): complete.
    (LogRecord(status=200, flags=DC, tokens=6), "ok"),
    (LogRecord(status=200, flags=frozenset({"downstream_remote_reset"}), tokens=6), "ok"),
    # Left mid-answer, or before any answer: a cancel.
    (LogRecord(status=200, flags=DC), "cancel"),
    (LogRecord(status=0, flags=DC, tokens=6), "cancel"),
    (LogRecord(status=503, flags=DC, end_s=0.9), "cancel"),
])
def test_client_leaving_after_a_complete_answer_is_ok(rec: LogRecord, outcome: str) -> None:
    assert outcome_of(rec) == outcome


def test_complete_then_left_is_timed_until_the_client_left() -> None:
    rec = LogRecord(status=200, flags=DC, duration_s=1.5, upstream_tx_s=0.1,
                    first_body_s=0.3, tokens=6)
    obs = observation_from_log(rec, "a", S, streaming=True)
    assert obs is not None and obs.outcome == "ok" and not obs.censored
    assert obs.e2e_s == pytest.approx(1.4) and obs.ttft_s == pytest.approx(0.3)
    assert obs.tpot_s == pytest.approx((1.4 - 0.3) / 5)
    done = observation_from_log(LogRecord(status=200, flags=DC, duration_s=1.5,
                                          upstream_tx_s=0.1, first_body_s=0.3, end_s=1.2,
                                          tokens=6), "a", S, streaming=True)
    assert done is not None and done.e2e_s == pytest.approx(1.2)


def test_flag_sets_are_disjoint() -> None:
    assert not (CANCEL_FLAGS & TIMEOUT_FLAGS or CANCEL_FLAGS & ERROR_FLAGS
                or TIMEOUT_FLAGS & ERROR_FLAGS)


def test_cancel_is_censored_at_the_time_waited_since_t0() -> None:
    rec = LogRecord(status=200, flags=frozenset({"downstream_connection_termination"}),
                    duration_s=0.5, upstream_tx_s=0.1, first_body_s=None)
    obs = observation_from_log(rec, "a", S, streaming=True)
    assert obs is not None and obs.censored and obs.outcome == "cancel"
    assert obs.e2e_s == pytest.approx(0.4) and obs.ttft_s == pytest.approx(0.4)


def test_never_sent_upstream_gives_no_latency() -> None:
    rec = LogRecord(status=0, flags=frozenset({"downstream_remote_reset"}), duration_s=0.2)
    obs = observation_from_log(rec, "a", S, streaming=True)
    assert obs is not None and obs.e2e_s is None and obs.ttft_s is None


@given(first=st.floats(0, 10), tail=st.floats(0, 10), offset=st.floats(0, 5),
       tokens=st.integers(0, 5000))
def test_ok_observation_is_consistent(first: float, tail: float, offset: float,
                                      tokens: int) -> None:
    rec = LogRecord(status=200, first_body_s=first, end_s=first + tail, tokens=tokens)
    obs = observation_from_log(rec, "a", S, streaming=True, ttft_offset_s=offset)
    assert obs is not None and obs.outcome == "ok" and not obs.censored
    assert obs.ttft_s is not None and obs.e2e_s is not None
    assert 0 <= obs.ttft_s <= obs.e2e_s
    if obs.tpot_s is not None:
        assert tokens >= 2 and obs.tpot_s >= 0


def test_exact_first_token_beats_the_offset_and_unary_has_no_ttft() -> None:
    rec = LogRecord(status=200, first_body_s=0.01, end_s=0.5, tokens=3)
    obs = observation_from_log(rec, "a", S, streaming=True, ttft_offset_s=0.2,
                               first_token_s=0.1)
    assert obs is not None and obs.ttft_s == pytest.approx(0.1)
    unary = observation_from_log(rec, "a", S._replace(streaming=False), streaming=False)
    assert unary is not None and unary.ttft_s is None and unary.e2e_s == pytest.approx(0.5)


def test_offset_book_median_fallback_and_sampling() -> None:
    book = OffsetBook(share=0.0, min_samples=3, window=5)
    rng = random.Random(1)
    assert [book.wants_sample("a", S, rng) for _ in range(4)] == [True, True, True, False]
    assert book.offset("a", S) == 0.0
    other = S._replace(klass="batch")
    for v in (0.001, 0.003, 0.002):
        book.add("a", other, v)
    # Fewer than min_samples for S: the cluster's own offsets are the fallback.
    assert book.offset("a", S) == pytest.approx(0.002)
    for v in (0.010, 0.012, 0.011, -1.0):
        book.add("a", S, v)
    assert book.offset("a", S) == pytest.approx(0.0105)  # the negative one clamps to 0
    assert book.blind("a", S) and book.offset("a", S) >= BLIND_OFFSET_S


@pytest.mark.parametrize(("early", "blind"), [(0, False), (1, False), (2, True), (8, True)])
def test_a_route_whose_slow_streams_open_early_is_blind(early: int, blind: bool) -> None:
    """Keep-alive comments sent only while a request waits open exactly the slow
    streams early: the median offset stays 0, yet the first body byte caps every
    unsampled TTFT at the keep-alive interval. Two early openings in the window read
    make the route blind (its TTFT from sampled streams only)."""
    book = OffsetBook(share=0.05, min_samples=8, window=64)
    for i in range(64):
        book.add("a", S, 2.5 if i < early else 0.0)  # a slow stream's first body byte: a comment
    assert book.offset("a", S) == 0.0
    assert book.blind("a", S) is blind
    assert book.summary()["a"]["blind"] is blind and book.summary()["a"]["early"] == early
    rng = random.Random(3)
    share = sum(book.wants_sample("a", S, rng) for _ in range(4000)) / 4000
    assert (share > 0.15) is blind  # blind_share (0.25) against share (0.05)


def test_offset_book_keeps_a_bounded_number_of_slices() -> None:
    book = OffsetBook(share=0.0, min_samples=1, window=4, max_keys=3)
    for i in range(10):
        book.add("a", S._replace(model=f"m{i}"), 0.001)
    assert sum(book.samples("a", S._replace(model=f"m{i}")) > 0 for i in range(10)) == 3


def test_wire_entry_converts_to_a_record() -> None:
    e = al.HTTPAccessLogEntry()
    c = e.common_properties
    c.time_to_first_upstream_tx_byte.FromMicroseconds(300)
    c.duration.FromMicroseconds(9000)
    c.custom_tags["tr_first_body_us"] = "2100"
    c.custom_tags["tr_end_us"] = "garbled"
    c.response_flags.downstream_connection_termination = True
    c.upstream_cluster = "b"
    fm = c.metadata.filter_metadata
    fm["tailroute"].fields["rid"].string_value = "x-1"
    fm["tailroute"].fields["route"].string_value = "b|interactive|n"
    fm["tailroute.usage"].fields["output_tokens"].number_value = 7
    e.response.response_code.value = 200
    e.request.request_method = 3
    e.request.path = "/v1/chat/completions"
    e.request.request_body_bytes = 120
    rec = record_from_entry(al.HTTPAccessLogEntry.FromString(e.SerializeToString()))
    assert rec == LogRecord(
        status=200, flags=frozenset({"downstream_connection_termination"}), method="POST",
        path="/v1/chat/completions", upstream_cluster="b", duration_s=pytest.approx(0.009),
        upstream_tx_s=pytest.approx(0.0003), first_body_s=pytest.approx(0.0021), end_s=None,
        tokens=7, rid="x-1", route_key="b|interactive|n", body_bytes=120)


ERR = {"stream_error": True}
RST = frozenset({"downstream_remote_reset"})


@pytest.mark.parametrize(("rec", "outcome"), [
    # A provider that failed mid-stream behind its 200: an error, whatever else happened.
    (LogRecord(status=200, end_s=0.2, tokens=None, **ERR), "error"),
    (LogRecord(status=200, end_s=0.2, tokens=5, **ERR), "error"),
    (LogRecord(status=206, end_s=0.2, **ERR), "error"),
    # The SDK raises at the error event and closes: the client left after the failure.
    (LogRecord(status=200, flags=RST, **ERR), "error"),
    (LogRecord(status=200, flags=DC, end_s=0.2, **ERR), "error"),
    (LogRecord(status=200, flags=frozenset({"stream_idle_timeout"}), **ERR), "error"),
    (LogRecord(status=200, flags=frozenset({"upstream_remote_reset"}), **ERR), "error"),
    # The mark only speaks for a 2xx: the status and flags decide the rest as before.
    (LogRecord(status=500, **ERR), "error"),
    (LogRecord(status=504, **ERR), "timeout"),
    (LogRecord(status=404, **ERR), None),
    (LogRecord(status=0, flags=RST, **ERR), "cancel"),
    (LogRecord(status=429, details="tailroute_defer_overload", **ERR), None),
    (LogRecord(status=200, details="tailroute_x", **ERR), None),
    # Without the mark a short 200 stream stays ok.
    (LogRecord(status=200, end_s=0.2), "ok"),
])
def test_an_error_event_in_a_2xx_stream_makes_an_error(rec: LogRecord,
                                                         outcome: str | None) -> None:
    assert outcome_of(rec) == outcome
    obs = observation_from_log(rec, "a", S, streaming=True)
    assert (obs.outcome if obs is not None else None) == outcome
    if outcome == "error":
        assert obs is not None and obs.ttft_s is obs.tpot_s is None
        assert obs.e2e_s is None  # a cut stream is dated when seen
        assert latency_indices(obs, Buckets(0.02)) is None  # never a latency sample
        assert not obs.censored  # nor a lower bound: its duration only dates it


def _marked(tag: str | None, metadata: bool) -> al.HTTPAccessLogEntry:
    e = al.HTTPAccessLogEntry()
    c = e.common_properties
    if tag is not None:
        c.custom_tags["tr"] = tag
    fm = c.metadata.filter_metadata
    fm["tailroute.usage"].fields["output_tokens"].number_value = 3
    if metadata:
        fm["tailroute.usage"].fields["stream_error"].number_value = 1
    e.response.response_code.value = 200
    return al.HTTPAccessLogEntry.FromString(e.SerializeToString())


@pytest.mark.parametrize(("tag", "metadata", "marked"), [
    (None, False, False),  # extproc bootstrap: two duration tags, the metadata only
    (None, True, True),
    ("200|-|100|900|3||", False, False),  # native: the tag's last part, empty when unset
    ("200|-|100|900|3||-", False, False),  # "-" as a text formatter prints a missing key
    ("200|-|100|900|3||1", False, True),
    ("200|-|100|900|3||1", True, True),
    ("200|-|100|900|3|", True, True),  # a bootstrap rendered before the part existed
    ("200|-|100|900|3|", False, False),
])
def test_the_stream_error_mark_is_read_from_the_metadata_or_the_entry_tag(
        tag: str | None, metadata: bool, marked: bool) -> None:
    rec = record_from_entry(_marked(tag, metadata))
    assert rec.stream_error is marked and rec.tokens == 3
    if tag is not None:
        assert rec.end_s == pytest.approx(0.0009)  # the tag is read, old format included


def _lifted(values: dict[str, object], tag: str | None = None) -> al.HTTPAccessLogEntry:
    """An entry whose usage metadata holds the mark and these lifted error values."""
    e = al.HTTPAccessLogEntry()
    c = e.common_properties
    if tag is not None:
        c.custom_tags["tr"] = tag
    fields = c.metadata.filter_metadata["tailroute.usage"].fields
    fields["stream_error"].number_value = 1
    for key, value in values.items():
        v = fields["error_value." + key]
        if isinstance(value, bool):
            v.bool_value = value
        elif isinstance(value, int | float):
            v.number_value = value
        elif isinstance(value, str):
            v.string_value = value
        elif isinstance(value, dict):
            v.struct_value.update(value)
        else:
            v.null_value = struct_pb2.NULL_VALUE
    e.response.response_code.value = 200
    return al.HTTPAccessLogEntry.FromString(e.SerializeToString())


@pytest.mark.parametrize(("values", "error"), [
    # What Envoy lifts (an object as its JSON text, {} as the text "null").
    ({"error": "upstream overloaded"}, True),
    ({"error": '{"code":500}'}, True),
    ({"error": "null"}, True),
    ({"error": 500.0}, True),
    ({"error": True}, True),
    ({"message": "oops"}, True),
    ({"response.error": '{"code":"server_error"}'}, True),
    # A provider's "no error".
    ({"error": ""}, False),
    ({"error": False}, False),
    ({"error": 0.0}, False),
    ({"message": ""}, False),
    # Any field that reports one is enough.
    ({"error": "", "message": "oops"}, True),
    ({"error": "", "message": "", "response.error": ""}, False),
    # Not lifted by Envoy, read as it would be.
    ({"error": {"code": 500}}, True),
    ({"error": None}, False),
    # The mark of a bootstrap that lifted no values: an error by itself.
    ({}, True),
])
@pytest.mark.parametrize("tag", [None, "200|-|100|900|||1"])
def test_lifted_error_values_are_judged_as_the_timer_judges_them(
        values: dict[str, object], error: bool, tag: str | None) -> None:
    assert record_from_entry(_lifted(values, tag)).stream_error is error


@pytest.mark.parametrize(("attempts", "status", "errors"), [
    (1, 200, 0),  # no retry: the request is all there is
    (3, 200, 2),  # two failed attempts, then an answer
    (2, 503, 1),  # retried once, the last attempt failed too (that one is the outcome)
])
def test_retried_attempts_are_errors_of_the_route(attempts: int, status: int,
                                                  errors: int) -> None:
    rec = LogRecord(status=status, first_body_s=0.1, end_s=0.5, tokens=5, attempts=attempts)
    obs = observation_from_log(rec, "a", S, True)
    assert obs is not None and not obs.attempt
    failed = retried_attempts(rec, obs)
    assert len(failed) == errors
    for f in failed:
        assert (f.cluster, f.slice, f.outcome, f.attempt) == ("a", S, "error", True)
        assert f.status is None and f.ttft_s is None and f.e2e_s is None


@pytest.mark.parametrize(("rec", "dated"), [
    (LogRecord(status=503, end_s=5.0), 5.0),  # the upstream answered 503 after 5 s
    (LogRecord(status=500, end_s=0.04), 0.04),
    (LogRecord(status=503, end_s=5.0, flags=frozenset({"upstream_remote_reset"})), None),
    (LogRecord(status=503, flags=frozenset({"upstream_connection_failure"})), None),
    (LogRecord(status=200, end_s=5.0, stream_error=True), None),  # cut by an error event
])
def test_an_error_status_is_dated_by_how_long_it_took(rec: LogRecord,
                                                      dated: float | None) -> None:
    """An error answered by the upstream keeps its duration (the fast path dates the
    request by it); a reset or a cut stream is dated when seen. Never a sample."""
    obs = observation_from_log(rec, "a", S, streaming=True)
    assert obs is not None and obs.outcome == "error" and obs.e2e_s == dated
    assert latency_indices(obs, Buckets(0.02)) is None


@pytest.mark.parametrize(("rec", "outcome"), [
    # Envoy's [DONE] mark, then the client left (the SDK closes at [DONE]): complete,
    # without usage and before Envoy saw the upstream's end.
    (LogRecord(status=200, flags=RST, done_s=0.8), "ok"),
    (LogRecord(status=200, flags=DC, done_s=0.8), "ok"),
    (LogRecord(status=200, flags=DC, done_s=0.0), "ok"),  # marked at t0: still marked
    # Unmarked: a user pressing stop, as before.
    (LogRecord(status=200, flags=RST), "cancel"),
    # The mark speaks for a 2xx only, and an error event still wins.
    (LogRecord(status=0, flags=RST, done_s=0.8), "cancel"),
    (LogRecord(status=503, flags=RST, done_s=0.8), "cancel"),
    (LogRecord(status=200, flags=RST, done_s=0.8, stream_error=True), "error"),
    # Without a client leaving, the flags and the end decide as before.
    (LogRecord(status=200, end_s=0.9, done_s=0.8), "ok"),
    (LogRecord(status=200, flags=frozenset({"stream_idle_timeout"}), done_s=0.8), "timeout"),
])
def test_a_client_that_left_after_the_done_mark_had_a_complete_answer(
        rec: LogRecord, outcome: str) -> None:
    assert outcome_of(rec) == outcome
    obs = observation_from_log(rec, "a", S, streaming=True)
    assert obs is not None and obs.outcome == outcome


@pytest.mark.parametrize(("done_s", "tokens", "e2e", "tpot"), [
    (1.0, None, 1.0, None),  # the mark's time; no usage: no TPOT
    (1.0, 6, 1.0, (1.0 - 0.3) / 5),  # usage too: TPOT until the mark
    (2.0, None, 1.4, None),  # never after the client left (clocks apart): the wait
])
def test_a_done_marked_answer_is_timed_until_its_mark(
        done_s: float, tokens: int | None, e2e: float, tpot: float | None) -> None:
    rec = LogRecord(status=200, flags=RST, duration_s=1.5, upstream_tx_s=0.1,
                    first_body_s=0.3, tokens=tokens, done_s=done_s)
    obs = observation_from_log(rec, "a", S, streaming=True)
    assert obs is not None and obs.outcome == "ok" and not obs.censored
    assert not obs.ttft_measured  # an ok's TTFT, not a cancel's
    assert obs.e2e_s == pytest.approx(e2e) and obs.ttft_s == pytest.approx(0.3)
    assert obs.tpot_s == (None if tpot is None else pytest.approx(tpot))
    # The same entry unmarked: a cancel with a measured first token and no end.
    plain = observation_from_log(LogRecord(status=200, flags=RST, duration_s=1.5,
                                           upstream_tx_s=0.1, first_body_s=0.3),
                                 "a", S, streaming=True)
    assert plain is not None and plain.outcome == "cancel" and plain.ttft_measured


@pytest.mark.parametrize(("mark", "tx", "done_s"), [
    ("1765000000800000", True, 0.8 - 0.0003),  # Envoy's clock, us since the epoch
    ("1765000000000000", True, 0.0),  # before t0 (a clock step): at t0
    ("", True, None),  # garbled or absent: no mark
    ("-5", True, None),
    (None, True, None),
    ("1765000000800000", False, None),  # never sent upstream: nothing to place it on
])
def test_the_done_mark_is_read_from_the_metadata_as_time_since_t0(
        mark: str | None, tx: bool, done_s: float | None) -> None:
    e = al.HTTPAccessLogEntry()
    c = e.common_properties
    c.start_time.FromMicroseconds(1765000000000000)
    if tx:
        c.time_to_first_upstream_tx_byte.FromMicroseconds(300)
    c.response_flags.downstream_remote_reset = True
    fields = c.metadata.filter_metadata["tailroute.usage"].fields
    if mark is not None:
        fields["done"].string_value = mark
    e.response.response_code.value = 200
    rec = record_from_entry(al.HTTPAccessLogEntry.FromString(e.SerializeToString()))
    assert rec.done_s == (None if done_s is None else pytest.approx(done_s))
    assert outcome_of(rec) == ("ok" if done_s is not None else "cancel")


@pytest.mark.parametrize(("status", "measured"), [
    (200, True),  # a stream's first body byte: its first token (plus the offset)
    (503, False),  # the first byte of an error's body is no token
    (500, False),
    (429, False),
])
def test_only_a_2xx_cancel_has_a_measured_first_token(status: int, measured: bool) -> None:
    # The client left while the upstream's answer was still coming: a 2xx's first body
    # byte dates its first token, an error status's body is the error (a fast 503 kept as
    # a TTFT sample would make a failing route look quick).
    rec = LogRecord(status=status, flags=RST, duration_s=1.5, upstream_tx_s=0.1,
                    first_body_s=0.05)
    obs = observation_from_log(rec, "a", S, streaming=True)
    assert obs is not None and obs.outcome == "cancel"
    assert obs.ttft_measured is measured
