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


def test_a_run_running_elsewhere_is_refused_before_any_work(tmp_path):
    """``rlfoundry run``/``resume`` of a run another live process runs: refused naming it, nothing written."""
    import multiprocessing as mp

    from tests.unit.test_run_lock import _hold

    spawn = mp.get_context("spawn")
    ready = spawn.Event()
    proc = spawn.Process(target=_hold, args=(str(tmp_path / "store"), ready), daemon=True)
    proc.start()
    try:
        assert ready.wait(60)
        r = run_cli(["run", "configs/smoke.yaml", "--run-id", "r1"], tmp_path, timeout=300)
        assert r.returncode == 2 and "run r1 is running in another process" in r.stderr, r.stderr[-2000:]
        assert f"pid {proc.pid}" in r.stderr and "Traceback" not in r.stderr
        assert sorted(p.name for p in (tmp_path / "store" / "r1").iterdir()) == [
            "run.lock",
            f"run.lock-{_beat_token(tmp_path)}.beat",
        ]
    finally:
        proc.kill()
        proc.join()


def _beat_token(state) -> str:
    import json

    return json.loads((state / "store" / "r1" / "run.lock").read_text())["token"]
