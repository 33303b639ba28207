"""A failing rank's own words reach the caller's traceback: launch_local's CalledProcessError
carries the last lines of the ranks' captured stderr as a note (pytest prints notes; it does not
print the exception's ``stderr`` attribute)."""

import subprocess

import pytest

from verl_mp.utils.launch import launch_local

pytestmark = pytest.mark.dist


def test_the_ranks_last_lines_are_in_the_error(tmp_path):
    prog = tmp_path / "fails.py"
    prog.write_text("import sys\nfor i in range(80):\n    print(f'line {i}', file=sys.stderr)\n"
                    "print('the cause: no such shard', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(subprocess.CalledProcessError) as caught:
        launch_local(str(prog), 1, module=False, timeout_s=120, capture_output=True)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "the cause: no such shard" in notes and "line 79" in notes
    assert "line 0\n" not in notes  # only the last 60 lines
    assert "the cause: no such shard" in caught.value.stderr  # the attribute keeps all of it
