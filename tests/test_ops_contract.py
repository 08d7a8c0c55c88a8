"""The contract's compatibility: `buf breaking` against a buf image of the last release (0.1.0,
proto/baseline), and the options other languages' generated code needs, the same on every file."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROTO = Path(__file__).resolve().parent.parent / "proto"
OPTIONS = {
    "csharp_namespace": "Sapgrid.V1",
    "go_package": "sapgrid/gen/go/sapgrid/v1;sapgridv1",
    "java_multiple_files": "true",
    "java_package": "dev.sapgrid.v1",
}


def _buf() -> str:
    cand = Path(sys.executable).parent / "buf"
    found = str(cand) if cand.exists() else shutil.which("buf")
    if not found:
        pytest.fail("buf not found: install the test extras (pip install -e '.[test]', PyPI buf-bin)")
    return found


def test_no_breaking_change_against_the_last_release():
    out = subprocess.run([_buf(), "breaking", "--against", "baseline/sapgrid-0.1.0.binpb"], cwd=PROTO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_breaking_check_catches_a_removed_field(tmp_path):
    # the check can fail: a copy of the module with a field dropped from a message is refused
    shutil.copytree(PROTO / "sapgrid", tmp_path / "sapgrid")
    shutil.copy(PROTO / "buf.yaml", tmp_path / "buf.yaml")
    world = tmp_path / "sapgrid" / "v1" / "world.proto"
    text = world.read_text()
    first_field = re.search(r"^\s+\w+ \w+ = 1;\n", text, re.M)
    world.write_text(text[:first_field.start()] + "\n" + text[first_field.end():])
    out = subprocess.run([_buf(), "breaking", "--against", str(PROTO / "baseline" / "sapgrid-0.1.0.binpb")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "deleted" in out.stdout.lower(), out.stdout + out.stderr


def test_every_file_sets_the_other_languages_options():
    for proto in sorted((PROTO / "sapgrid" / "v1").glob("*.proto")):
        text = proto.read_text()
        for name, value in OPTIONS.items():
            quoted = value if value == "true" else f'"{value}"'
            assert f"option {name} = {quoted};" in text, f"{proto.name}: option {name}"
        assert re.search(r'option java_outer_classname = "\w+Proto";', text), proto.name
