"""The presets' cache root: `$RAGEN_LIT_CACHE`, else `$XDG_CACHE_HOME/ragen_lit`, else `~/.cache/ragen_lit`."""

from __future__ import annotations

from ragen_lit.presets.cache import CACHE_ENV, default_cache_dir, discard_folder


def test_ragen_lit_cache_wins_over_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "cache"


def test_xdg_cache_home_when_no_ragen_lit_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "ragen_lit"


def test_home_cache_when_neither_is_set(monkeypatch, tmp_path):
    # An empty variable counts as unset, as in the XDG base directory spec.
    monkeypatch.setenv(CACHE_ENV, "")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "ragen_lit"


def test_user_folder_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(CACHE_ENV, "~/mine")
    assert default_cache_dir() == tmp_path / "mine"


def test_discard_folder_removes_it_and_leaves_nothing_behind(tmp_path):
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "weights.bin").write_bytes(b"x")
    (tmp_path / "other").mkdir()
    discard_folder(folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]
