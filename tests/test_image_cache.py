"""The cache of Harbor task images the sandbox builds (`harbor/build.py`): bounded, the least
recently used out first, never one a trial is laid over; `tether images` lists and clears."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import cli_env, tether
from tether.harbor import build


def image(top: Path, name: str, kib: int, used: float) -> Path:
    path = top / "tether" / "harbor-images" / name
    (path / "fs").mkdir(parents=True)
    (path / "fs" / "data").write_bytes(os.urandom(kib * 1024))
    os.utime(path, (used, used))
    return path


def test_the_cache_keeps_its_bound_the_least_recently_used_out_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four images of 400 KiB and a bound of 1 MiB: the two used longest ago go, but one a
    trial holds (its overlay is laid over it) and the one just built stay."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("TETHER_HARBOR_CACHE_GB", str(1 / 1024))
    oldest, held, older, newest = (
        image(tmp_path, name, 400, when)
        for name, when in (("a1", 1000.0), ("b2", 2000.0), ("c3", 3000.0), ("d4", 4000.0))
    )
    holding = build.in_use(held)  # a trial laid over it (and its use noted: now)
    try:
        removed = build.evict(keep=newest)
    finally:
        os.close(holding)
    assert [k.key for k in removed] == ["a1", "c3"]
    assert not oldest.exists() and not older.exists()
    assert held.exists() and newest.exists()
    assert [k.key for k in build.kept()] == ["d4", "b2"]  # b2 used last


def test_tether_images_lists_and_clears_them(tmp_path: Path) -> None:
    image(tmp_path, "e5", 64, 5000.0)
    env = cli_env(XDG_CACHE_HOME=str(tmp_path))
    listed = tether("images", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    (entry,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert entry["key"] == "e5" and entry["bytes"] >= 64 * 1024
    cleared = tether("images", "--clear", env=env)
    assert cleared.returncode == 0 and cleared.stdout.startswith("removed 1 images")
    assert "no images are kept" in tether("images", env=env).stdout
