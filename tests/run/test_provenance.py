"""The code and weights a run names: the source commit with its dirty flag, and the starting weights' sha256."""

from __future__ import annotations

import hashlib
import subprocess

from ragen_lit.run.provenance import run_tags, source_commit, weights_sha256


def test_weights_digest_covers_the_weight_files_names_and_bytes_only(tmp_path):
    (tmp_path / "b.safetensors").write_bytes(b"second")
    (tmp_path / "a.safetensors").write_bytes(b"first")
    (tmp_path / "config.json").write_text("{}")
    want = hashlib.sha256(b"a.safetensors\0first" + b"b.safetensors\0second").hexdigest()
    assert weights_sha256(tmp_path) == want
    (tmp_path / "config.json").write_text('{"changed": 1}')  # not a weight file
    assert weights_sha256(tmp_path) == want
    (tmp_path / "b.safetensors").write_bytes(b"SECOND")
    assert weights_sha256(tmp_path) != want
    assert weights_sha256(tmp_path / "a.safetensors") == hashlib.sha256(b"a.safetensors\0first").hexdigest()
    assert weights_sha256(tmp_path / "missing") is None
    assert weights_sha256("Qwen/Qwen2.5-0.5B-Instruct") is None  # a hub id: nothing on this machine to hash


def test_commit_and_dirty_flag_of_a_checkout(tmp_path):
    assert source_commit(tmp_path) is None  # no git checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "code.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / "notes.txt").write_text("untracked files do not make it dirty")
    assert source_commit(tmp_path) == (head, False)
    (tmp_path / "code.py").write_text("x = 2\n")
    assert source_commit(tmp_path) == (head, True)


def test_a_named_commit_wins_over_the_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGEN_LIT_COMMIT", "1779e11")
    assert source_commit(tmp_path) == ("1779e11", False)  # no checkout there: the name alone
    monkeypatch.setenv("RAGEN_LIT_COMMIT", "1779e11+dirty")
    assert source_commit() == ("1779e11", True)  # inside this checkout too


def test_run_tags_name_both(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"w")
    tags = run_tags(str(tmp_path))
    assert tags["ragen_lit.weights_sha256"] == weights_sha256(tmp_path)
    commit = source_commit()
    if commit is None:  # an installed copy outside a checkout records no commit
        assert "ragen_lit.commit" not in tags
    else:
        assert (tags["ragen_lit.commit"], tags["ragen_lit.commit_dirty"]) == (commit[0], str(commit[1]).lower())
