"""A snapshot's rename reaches the disk: the file is synced before it and its directory
after it (POSIX keeps a rename in the directory's entries). Where the directory cannot
be opened or synced, the write still succeeds."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from sidecar.ops import snapshot


class _Disk:
    """Records what the write asks of the disk (the real calls still run); may refuse a
    directory's open or fsync as some platforms do."""

    def __init__(self, refuse: str | None) -> None:
        self.refuse = refuse
        self.events: list[tuple[str, object]] = []
        self._open, self._fsync, self._replace = os.open, os.fsync, os.replace

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(os, "open", self.open)
        monkeypatch.setattr(os, "fsync", self.fsync)
        monkeypatch.setattr(os, "replace", self.replace)

    def open(self, path: str | os.PathLike[str], flags: int, *args: int) -> int:
        if self.refuse == "open" and Path(path).is_dir():
            raise PermissionError(errno.EACCES, "a directory cannot be opened here", path)
        return self._open(path, flags, *args)

    def fsync(self, fd: int) -> None:
        st = os.fstat(fd)
        what = ("dir", st.st_ino) if stat.S_ISDIR(st.st_mode) else ("file", st.st_ino)
        if self.refuse == "fsync" and what[0] == "dir":
            raise OSError(errno.EINVAL, "Invalid argument")
        self._fsync(fd)
        self.events.append(what)

    def replace(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        self._replace(src, dst)
        self.events.append(("replace", os.stat(dst).st_ino))


@pytest.mark.parametrize("refuse", [None, "open", "fsync"])
def test_the_rename_is_made_durable_by_syncing_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuse: str | None,
) -> None:
    path = tmp_path / "snaps" / "tailroute.json"
    path.parent.mkdir()
    path.write_text("old")
    disk = _Disk(refuse)
    disk.install(monkeypatch)
    assert snapshot.write_text_atomic(path, ["new ", "snapshot"]) == 12
    monkeypatch.undo()
    assert path.read_text() == "new snapshot"
    assert [p.name for p in path.parent.iterdir()] == ["tailroute.json"]
    new = path.stat().st_ino
    synced_dir = [] if refuse else [("dir", path.parent.stat().st_ino)]
    # The file's bytes before the rename, the directory (the rename) after it.
    assert disk.events == [("file", new), ("replace", new), *synced_dir]
