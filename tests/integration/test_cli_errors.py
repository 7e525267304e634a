"""A corrupt artifact that no command caught (a run record truncated by a full disk, a manifest cut short)
ends the program with one line naming it and exit 2, not an 80-line traceback ending in JSONDecodeError."""

from __future__ import annotations

from tests.conftest import run_cli


def test_a_corrupt_run_record_is_named_in_one_line(tmp_path):
    record = tmp_path / "store" / "r1" / "run.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"run_id": "r1", "conf')  # cut short
    for cmd in (["show", "r1"], ["show", "r1", "--json"], ["resume", "r1"]):
        r = run_cli(cmd, tmp_path, timeout=300)
        said = r.stdout[-2000:] + r.stderr[-2000:]
        assert r.returncode == 2, (cmd, said)
        assert "error: corrupt JSON: " in r.stderr and "r1/run.json" in r.stderr, (cmd, said)
        assert "Traceback" not in said, (cmd, said)
    assert record.read_text() == '{"run_id": "r1", "conf'  # nothing rewrote it
