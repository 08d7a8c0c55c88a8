"""``sapgrid auth token``: a file that cannot be written, or one that is not a valid auth file, is one line
naming it, exit code 2, and nothing is written; a good one gets the entry and prints the token last."""
from __future__ import annotations

import os

from sapgrid.server import auth
from sapgrid.tools import cli


def test_an_auth_file_in_a_missing_directory(tmp_path, capsys):
    path = tmp_path / "no-such-dir" / "auth.toml"
    assert cli.main(["auth", "token", "--file", str(path), "--name", "ops", "--role", "admin"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--file {path}: cannot write it" in err and ".tmp" not in err
    assert not (tmp_path / "no-such-dir").exists()


def test_a_bad_auth_file_is_left_as_it_was(tmp_path, capsys):
    path = tmp_path / "auth.toml"
    path.write_text("[[tokens]\n")
    assert cli.main(["auth", "token", "--file", str(path), "--name", "ops", "--role", "admin"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "not valid TOML" in err
    assert path.read_text() == "[[tokens]\n" and os.listdir(tmp_path) == ["auth.toml"]


def test_a_token_is_appended_and_printed_last(tmp_path, capsys):
    path = tmp_path / "auth.toml"
    assert cli.main(["auth", "token", "--file", str(path), "--name", "ops", "--role", "writer",
                     "--worlds", "match-*"]) == 0
    token = capsys.readouterr().out.split()[-1]
    entries = auth.load(str(path))
    assert token not in path.read_text() and entries is not None
    assert auth.hash_token(token) in path.read_text()
