"""When a stack's work directory is removed and when it stays (sidecar.devtools.harness)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

from sidecar.devtools import harness
from sidecar.devtools.harness import KEEP_ENV, Stack


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    # An earlier failure in the session (conftest's hook) or the caller's environment
    # must not decide these cases.
    monkeypatch.setattr(harness, "_kept_workdirs", set())
    monkeypatch.delenv(KEEP_ENV, raising=False)


def _exit(stack: Stack, fail: bool) -> Path:
    (stack.workdir / "sidecar.log").write_text("something to read later\n")
    with pytest.raises(RuntimeError) if fail else contextlib.nullcontext(), stack:
        if fail:
            raise RuntimeError("the test body failed")
    return stack.workdir


@pytest.mark.parametrize(
    ("keep", "env", "after_failure", "fail", "kept"),
    [
        (False, None, False, False, False),  # clean exit: removed
        (False, None, False, True, True),  # the with block raised: kept
        (True, None, False, False, True),  # Stack(keep=True): make demo
        (False, "1", False, False, True),  # TAILROUTE_KEEP_WORKDIR=1
        (False, "0", False, False, False),  # only "1" keeps
        (False, None, True, False, True),  # a test failed while it was open
    ],
)
def test_workdir_kept_only_for_a_post_mortem(
    monkeypatch: pytest.MonkeyPatch, keep: bool, env: str | None, after_failure: bool,
    fail: bool, kept: bool,
) -> None:
    if env is not None:
        monkeypatch.setenv(KEEP_ENV, env)
    stack = Stack(keep=keep)
    if after_failure:
        harness.keep_workdirs()
    workdir = _exit(stack, fail)
    try:
        assert workdir.exists() is kept
        if kept:
            assert (workdir / "sidecar.log").read_text() == "something to read later\n"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_stack_opened_after_a_failure_is_removed_as_usual() -> None:
    """One failing test keeps the stacks it used, not those of every later test."""
    harness.keep_workdirs()  # a test failed, with no stack open
    workdir = _exit(Stack(), False)
    assert not workdir.exists()
