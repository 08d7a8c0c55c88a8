"""``sapgrid worlds``: one world by its name alone (``sapgrid worlds NAME``) with its pairs digest, frozen
state and where each writer stands; the list's writers column; a snapshot FILE that cannot be written or
a restore FILE that cannot be read is one line naming it, exit code 2, no traceback."""
from __future__ import annotations

import numpy as np

from sapgrid.client import Client
from sapgrid.layout import pairs_digest
from sapgrid.tools import cli


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_one_world_by_name_shows_digest_frozen_and_writers(server, world_name, capsys):
    with Client(server.address, timeout=60) as c:
        c.create_world(world_name, dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
        with c.stream(world_name, writer="match-7") as s:
            s.step(add_ids=[1, 2, 3], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3], [9, 9, 10, 10]])
            s.step(update_ids=[3], update_boxes=[[1, 1, 2, 2]])
        pairs = c.pairs(world_name)
        c.freeze(world_name, True)
    digest = pairs_digest(np.asarray(pairs, np.uint64))
    for argv in (["worlds", world_name], ["worlds", "list", world_name]):
        code, out, err = _run(capsys, *argv, "--server", server.address)
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].split()[-1] == "writers"
        row = lines[1].split()
        assert row[0] == world_name and row[4] == "3" and row[5] == "2" and row[7] == "1" and row[8] == "frozen"
        assert f"pairs digest {digest} " in out and "frozen (frames refused: moving)" in out
        assert "writer match-7: last applied seq 2" in out
    with Client(server.address, timeout=60) as c:
        c.freeze(world_name, False)
    code, out, _ = _run(capsys, "worlds", world_name, "--server", server.address)
    assert code == 0 and "not frozen" in out and "  frozen" not in out.splitlines()[1]
    code, out, _ = _run(capsys, "worlds", "--server", server.address)
    assert code == 0 and any(x.split()[0] == world_name and x.split()[-1] == "1" for x in out.splitlines()[1:])


def test_an_unknown_world_or_action(server, capsys):
    code, out, err = _run(capsys, "worlds", "no-such-world-qa", "--server", server.address)
    assert code == 1 and err.count("\n") == 1 and "NOT_FOUND" in err
    code, out, err = _run(capsys, "worlds", "bogus", "extra", "--server", server.address)
    assert code == 2 and err.count("\n") == 1 and "unknown action 'bogus'" in err


def test_snapshot_and_restore_files_that_cannot_be_used(server, world_name, tmp_path, capsys):
    with Client(server.address, timeout=60) as c:
        c.create_world(world_name, dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
    target = tmp_path / "no-such-dir" / "w.snap"
    code, out, err = _run(capsys, "worlds", "snapshot", world_name, str(target), "--server", server.address)
    assert code == 2 and err.count("\n") == 1 and str(target) in err and "cannot write it" in err
    assert not (tmp_path / "no-such-dir").exists()
    missing = tmp_path / "missing.snap"
    code, out, err = _run(capsys, "worlds", "restore", str(missing), "--server", server.address)
    assert code == 2 and err.count("\n") == 1 and f"{missing}: cannot read it" in err
    code, out, err = _run(capsys, "worlds", "snapshot", world_name, str(tmp_path / "w.snap"), "--server",
                          server.address)
    assert code == 0 and (tmp_path / "w.snap").stat().st_size > 24, err


def test_create_and_delete_arguments_are_checked_before_any_call(server, capsys):
    def names():
        with Client(server.address, timeout=60) as c:
            return {w.name for w in c.list_worlds()}

    before = names()
    for argv, words in ((["create", "qa-b", "--bounds", "0,0,x,1"], ["--bounds", "numbers"]),
                        (["create", "qa-c", "--cells", "a,4"], ["--cells", "integers"]),
                        (["create"], ["create NAME"]), (["delete"], ["delete NAME"]),
                        (["create", "qa-d", "extra"], ["create NAME"])):
        code, out, err = _run(capsys, "worlds", *argv, "--server", server.address)
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        for w in words:
            assert w in err, err
    assert names() == before


def test_a_reader_that_goes_away_is_no_traceback(server):
    """``sapgrid worlds | head -1``: the pipe closed before the table is written ends the command quietly."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SAPGRID_")}
    proc = subprocess.Popen([sys.executable, "-m", "sapgrid.tools.cli", "worlds", "--server", server.address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()                                   # the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
