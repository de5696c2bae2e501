"""Config files an operator may get wrong in ways the field checks do not see:
values YAML builds from a few bytes into something enormous, and numbers Python
reads but cannot write back. Each is a config error naming the file and the field,
never a traceback, a hang or gigabytes of memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.config import ConfigError
from sidecar.core.fields import shown
from tests.conftest import base_config_dict

COUNTED = 1 << 16  # characters of a long value's repr written, at most (fields.SHOWN_COUNTED)


def _alias_bomb(levels: int) -> str:
    """YAML anchors nine wide and ``levels`` deep: ``9 ** levels`` items from a few
    hundred bytes, every list shared by the next level's aliases."""
    out = ["x-bomb:", "  - &l0 [x, x, x, x, x, x, x, x, x]"]
    out += [f"  - &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(out) + "\n"


def _write(tmp_path: Path, data: dict[str, Any], head: str = "", **fields: str) -> Path:
    """``data`` as YAML after ``head``; each ``fields`` value replaces a placeholder."""
    text = head + yaml.safe_dump(data)
    for placeholder, yaml_text in fields.items():
        text = text.replace(placeholder, yaml_text)
    p = tmp_path / "tailroute.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(("where", "field"), [
    (lambda d: d["clusters"][0].update(max_concurrency="BOMB"), "clusters[0].max_concurrency"),
    (lambda d: d["clusters"][1].update(region="BOMB"), "clusters[1].region"),
    (lambda d: d["clusters"][0].update(models="BOMB"), "clusters[0].models"),
    (lambda d: d.update(snapshot_path="BOMB"), "snapshot_path"),
    (lambda d: d.update(limits={"max_body_bytes": "BOMB"}), "limits.max_body_bytes"),
    (lambda d: d.update(classes={"x": {"slo": {"max_stream_ms": "BOMB"}}}),
     "classes.x.slo.max_stream_ms"),
])
def test_an_alias_bomb_in_a_field_is_quoted_cut_short(tmp_path: Path, where: Any,
                                                      field: str) -> None:
    """The error quoting the value used to write its whole repr first: 9 ** 6 items
    are 3.5 million characters, and nine levels (9 ** 9) never finished, in
    check-config, at start, and in the hot-reload thread of a serving sidecar."""
    from sidecar.ops.config_file import load_config

    data = base_config_dict()
    where(data)
    p = _write(tmp_path, data, _alias_bomb(6), BOMB="*l5")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    problem = next(x for x in err.value.problems if f": {field}: " in x)
    assert problem.startswith(f"{p}: {field}: "), problem
    assert f"(more than {COUNTED} characters)" in problem, problem
    assert len(problem) < 300, problem


class _Leaf:
    """A value whose repr is counted."""

    written = 0

    def __repr__(self) -> str:
        _Leaf.written += 1
        return "leaf"


def test_shown_writes_only_what_it_quotes_of_a_shared_structure() -> None:
    level: list[Any] = [_Leaf()] * 9
    for _ in range(6):  # 9 ** 7 leaves, each list shared nine times by the next
        level = [level] * 9
    _Leaf.written = 0
    text = shown(level)
    assert text.startswith("[[[[[[[leaf, leaf") and text.endswith(
        f"(more than {COUNTED} characters)"), text
    assert _Leaf.written <= COUNTED  # not the 4.8 million leaves


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: (st.lists(inner) | st.dictionaries(st.text() | st.integers(), inner)
                   | st.tuples(inner) | st.tuples(inner, inner)
                   | st.frozensets(st.integers()) | st.sets(st.text())),
    max_leaves=30)


@given(_VALUES, st.integers(0, 200))
def test_repr_upto_is_repr_or_its_beginning(value: Any, limit: int) -> None:
    from sidecar.core.fields import repr_upto

    whole = repr(value)
    text, complete = repr_upto(value, limit)
    if len(whole) <= limit:
        assert (text, complete) == (whole, True)
    else:
        assert not complete and len(text) == limit
        assert whole.startswith(text), (text, whole)


@pytest.mark.parametrize("text", ["it's" + "x" * 40, 'it\'s "so"' + "x" * 40,
                                  b"it's" + b"x" * 40, b'it\'s "so"' + b"x" * 40])
def test_repr_upto_quotes_a_string_it_cuts_as_repr_quotes_it_whole(text: Any) -> None:
    """repr writes a string holding ' and no " in double quotes, and one holding both in
    single quotes: a beginning of it alone may hold only one of them."""
    from sidecar.core.fields import repr_upto

    for limit in range(len(repr(text))):
        cut, complete = repr_upto([text], limit)
        assert not complete and repr([text]).startswith(cut), (limit, cut)


def test_repr_upto_writes_cycles_as_repr_does() -> None:
    from sidecar.core.fields import repr_upto

    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    nested: dict[str, Any] = {}
    nested["self"] = {"again": nested}
    for value in (cyclic, nested):
        assert repr_upto(value, 100) == (repr(value), True)


@pytest.mark.parametrize("written", [
    "0x" + "f" * 4000,  # 4,817 decimal digits
    "0" + "7" * 5000,  # YAML 1.1 octal
    "0b" + "1" * 15000,
    "1" + ":59" * 1500,  # YAML 1.1 base 60 (2,500 digits: but its text is too long)
    "1" + ":59" * 300_000,  # read in quadratic time: 40 s
    "-0x" + "f" * 4000,
])
@pytest.mark.parametrize(("where", "line"), [
    (lambda d: d["clusters"][0].update(max_concurrency="BIG"), 3),
    (lambda d: d["clusters"][1].update(region="BIG"), 10),
])
def test_an_integer_python_cannot_write_is_a_yaml_error(
        tmp_path: Path, written: str, where: Any, line: int) -> None:
    """Python reads such integers but refuses to write one of more than 4,300 digits,
    so the error quoting it ended in a ValueError traceback."""
    from sidecar.ops.config_file import load_config

    data = base_config_dict()
    where(data)
    p = _write(tmp_path, data, BIG=written)
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert str(err.value).startswith(
        f"{p}: line {line}, column "), str(err.value)[:200]
    assert f"invalid YAML: integer of {len(written)} digits is too long" in str(err.value)


def _sparse(tmp_path: Path, size: int) -> Path:
    p = tmp_path / "tailroute.yaml"
    with p.open("wb") as f:
        f.truncate(size)  # no disk blocks
    return p


@pytest.mark.parametrize("where", [
    pytest.param(lambda tmp: _sparse(tmp, (16 << 20) + 1), id="sparse"),
    pytest.param(lambda _tmp: Path("/dev/zero"), id="dev-zero"),  # read till memory ran out
])
def test_a_config_file_over_16_mib_is_refused_unread(tmp_path: Path, where: Any) -> None:
    from sidecar.ops.config_file import load_config

    p = where(tmp_path)
    with pytest.raises(ConfigError, match=rf"^{p}: config file is larger than 16 MiB: refused$"):
        load_config(p)


def test_a_reload_of_a_file_over_16_mib_keeps_the_config(tmp_path: Path) -> None:
    from sidecar.core.config import parse_config
    from sidecar.ops.reload import ConfigReloader
    from sidecar.shell.app import App

    app = App.create(parse_config(base_config_dict(), "t.yaml"))
    good = app.config
    reloader = ConfigReloader(app, _sparse(tmp_path, (16 << 20) + 1))
    assert reloader.reload("test") is False and app.config is good
    assert reloader.view()["last_error"] == (
        f"{tmp_path / 'tailroute.yaml'}: config file is larger than 16 MiB: refused")


def test_a_config_file_of_16_mib_is_read(tmp_path: Path) -> None:
    from sidecar.ops.config_file import load_config

    p = tmp_path / "tailroute.yaml"
    text = yaml.safe_dump(base_config_dict())
    p.write_text(text + "#" * ((16 << 20) - len(text) - 1) + "\n")
    assert load_config(p).default_cluster == "a"


@pytest.mark.parametrize(("section", "addresses", "field", "problem"), [
    ("listen", {"grpc": "127.0.0.1:9911", "admin": "127.0.0.1:9911"}, "listen.admin",
     "127.0.0.1:9911 takes the port of listen.grpc (127.0.0.1:9911): the sidecar's ext_proc "
     "gRPC and its admin server cannot listen on one port; give one of them another"),
    ("listen", {"grpc": "0.0.0.0:9911", "admin": "127.0.0.1:9911"}, "listen.admin",
     "127.0.0.1:9911 takes the port of listen.grpc (0.0.0.0:9911)"),
    ("listen", {"grpc": "[::1]:9911", "admin": "[::]:9911"}, "listen.admin",
     "[::]:9911 takes the port of listen.grpc ([::1]:9911)"),
    ("envoy", {"listen": "127.0.0.1:9901", "admin": "127.0.0.1:9901"}, "envoy.admin",
     "127.0.0.1:9901 takes the port of envoy.listen (127.0.0.1:9901): Envoy's listener and "
     "its admin interface cannot listen on one port; give one of them another"),
])
def test_two_listeners_of_one_process_on_one_port_are_a_config_error(
        tmp_path: Path, section: str, addresses: dict[str, str], field: str,
        problem: str) -> None:
    """check-config said OK: serve then stopped blaming "another process", or the
    rendered bootstrap was one Envoy cannot start."""
    from sidecar.ops.config_file import load_config

    p = _write(tmp_path, base_config_dict(**{section: addresses}))
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert str(err.value).startswith(f"{p}: {field}: {problem}"), str(err.value)
    assert str(err.value).endswith(")") and "(line " in str(err.value)


@pytest.mark.parametrize("fields", [
    {"listen": {"grpc": "127.0.0.1:0", "admin": "127.0.0.1:0"}},  # 0: any free port
    {"listen": {"grpc": "", "admin": "127.0.0.1:50051", "grpc_unix": "/tmp/t.sock"}},
    {"listen": {"grpc": "localhost:9911", "admin": "127.0.0.1:9911"}},  # names not looked up
    {"listen": {"grpc": "0.0.0.0:9911", "admin": "[::1]:9911"}},  # another family
    {"listen": {"grpc": "127.0.0.1:9911", "admin": "127.0.0.2:9911"}},
    # the sidecar and Envoy are two processes, often in two network namespaces
    {"listen": {"grpc": "0.0.0.0:10000"}, "envoy": {"listen": "0.0.0.0:10000"}},
])
def test_listeners_that_can_share_a_port_number_are_accepted(fields: dict[str, Any]) -> None:
    from sidecar.core.config import parse_config

    parse_config(base_config_dict(**fields), "t.yaml")


@pytest.mark.parametrize(("classes", "keys"), [
    ({7: {"priority": 3}, "7": {"priority": 4}}, "7 and '7'"),
    ({"7": {"priority": 4}, "interactive": {}, 7: {"priority": 3}}, "'7' and 7"),
])
def test_a_class_named_twice_as_a_number_and_a_string_is_a_config_error(
        classes: dict[Any, Any], keys: str) -> None:
    """YAML's 7 and '7' are two keys, so the check for keys given twice let them by;
    the class name of both is "7": the config counted one class more than there are,
    and one of the two definitions was silently dropped."""
    from sidecar.core.config import parse_config

    with pytest.raises(ConfigError) as err:
        parse_config(base_config_dict(classes=classes), "t.yaml")
    assert err.value.problems == (
        f"t.yaml: classes.7: class '7' is defined twice (as {keys}: one class name)",)
