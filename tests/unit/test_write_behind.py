"""Write-behind commits: a stage's outputs written after its body returns, its manifest committed after them,
nothing read before; a failed write named, its stage left uncommitted and nothing else lost."""

import pickle
import threading

import pytest

from rl_core.artifacts.stage import StageResult, committed, run_stage
from rl_core.artifacts.store import Store
from rl_core.artifacts.write_behind import WriteBehindError
from rl_core.run.context import open_store
from rl_core.schema.config import Config


def _gated_body(store: Store, gate: threading.Event, data: bytes = b"weights"):
    """A train-like body whose one output is written only once ``gate`` is set."""

    def body(job):
        ref, write = store.planned(f"{job.out_uri}/model.bin", data)

        def gated() -> None:
            assert gate.wait(10), "the test never opened the gate"
            write()

        return StageResult(outputs={"checkpoint": ref}, pending=[gated])

    return body


def test_the_manifest_comes_back_before_the_writes_and_no_read_sees_the_stage_before_its_commit(tmp_path):
    store, gate = Store(str(tmp_path)), threading.Event()
    store.write_behind = True
    m = run_stage(store, "r", 1, "train", "h", {}, _gated_body(store, gate))
    uri = store.stage_uri("r", 1, "train")
    assert store.behind.pending() == [uri]  # returned while its write waits
    assert not (tmp_path / "r" / "iter-0001" / "train" / "_manifest.json").exists()
    got: dict = {}
    reader = threading.Thread(target=lambda: got.update(m=committed(store, "r", 1, "train")))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive(), "a read of the manifest must wait for the commit"
    gate.set()
    reader.join(10)
    assert got["m"] is not None and got["m"].outputs == m.outputs
    assert store.read_bytes(m.outputs["checkpoint"]) == b"weights"
    assert store.behind.pending() == []


def test_a_file_under_the_stage_waits_and_other_stages_do_not(tmp_path):
    store, gate = Store(str(tmp_path)), threading.Event()
    store.write_behind = True
    other = store.write_bytes(store.stage_uri("r", 1, "generate") + "/rollouts.bin", b"rows")
    m = run_stage(store, "r", 1, "train", "h", {}, _gated_body(store, gate))
    assert store.read_bytes(other) == b"rows"  # another stage's output: no wait (the gate is still shut)
    threading.Timer(0.2, gate.set).start()
    assert store.read_bytes(m.outputs["checkpoint"]) == b"weights"  # waited for the gate, then read


def test_a_failed_write_is_named_where_it_is_read_and_leaves_the_stage_uncommitted(tmp_path):
    store = Store(str(tmp_path))
    store.write_behind = True
    kept = run_stage(store, "r", 1, "generate", "h", {}, lambda job: StageResult(outputs={}))

    def failing(job):
        ref, _ = store.planned(f"{job.out_uri}/model.bin", b"w")

        def write() -> None:
            raise OSError(28, "No space left on device")

        return StageResult(outputs={"checkpoint": ref}, pending=[write])

    run_stage(store, "r", 1, "train", "h", {}, failing)
    with pytest.raises(WriteBehindError, match=r"iter-0001/train: .*No space left on device.*not committed"):
        committed(store, "r", 1, "train")
    assert committed(store, "r", 1, "train") is None  # not committed: a resume runs it again
    assert committed(store, "r", 1, "generate") == kept.model_copy(update={"reused": False})


def test_commits_land_in_the_order_they_were_handed_over(tmp_path):
    store, gate = Store(str(tmp_path)), threading.Event()
    store.write_behind = True
    ready = threading.Event()
    ready.set()
    run_stage(store, "r", 1, "train", "h", {}, _gated_body(store, gate))
    run_stage(store, "r", 2, "train", "h", {}, _gated_body(store, ready, b"second"))
    # the second's write could go now, but it waits behind the first (one thread, a fixed order)
    assert len(store.behind.pending()) == 2
    gate.set()
    store.behind.settle()
    assert committed(store, "r", 2, "train") is not None and store.behind.pending() == []


def test_without_write_behind_the_writes_are_done_before_the_stage_returns(tmp_path):
    store, gate = Store(str(tmp_path)), threading.Event()
    gate.set()
    run_stage(store, "r", 1, "train", "h", {}, _gated_body(store, gate))
    assert store.behind.pending() == []
    assert (tmp_path / "r" / "iter-0001" / "train" / "_manifest.json").exists()
    assert (tmp_path / "r" / "iter-0001" / "train" / "model.bin").read_bytes() == b"weights"


def test_a_store_sent_to_another_process_has_nothing_still_writing(tmp_path):
    store, gate = Store(str(tmp_path)), threading.Event()
    store.write_behind = True
    run_stage(store, "r", 1, "train", "h", {}, _gated_body(store, gate))
    threading.Timer(0.2, gate.set).start()
    copy = pickle.loads(pickle.dumps(store))  # waits for the commit first
    assert committed(copy, "r", 1, "train") is not None and copy.behind.pending() == []


def test_auto_writes_behind_on_a_remote_store_only(tmp_path):
    cfg = Config.model_validate({"store": {"uri": str(tmp_path)}})
    assert open_store(cfg).write_behind is False
    on = Config.model_validate({"store": {"uri": str(tmp_path), "write_behind": True}})
    assert open_store(on).write_behind is True
    remote = Config.model_validate({"store": {"uri": "s3://bucket/runs"}})
    assert open_store(remote).write_behind is True
    with pytest.raises(ValueError, match="write_behind"):
        Config.model_validate({"store": {"write_behind": "sometimes"}})


def test_a_body_called_by_itself_writes_its_outputs_before_it_returns(tmp_path):
    """A replay or a benchmark's loop calls a stage body without run_stage: the writes it would leave to the
    commit are done at once (``pending_or_done``); under run_stage, on a store writing behind, they wait."""
    from rl_core.artifacts.stage import pending_or_done

    store = Store(str(tmp_path))
    store.write_behind = True

    def body(job):
        ref, write = store.planned(f"{job.out_uri}/model.bin", b"w")
        return StageResult(outputs={"checkpoint": ref}, pending=pending_or_done([write]))

    alone = body(type("Job", (), {"out_uri": store.root + "/alone"})())
    assert alone.pending == [] and store.read_bytes(alone.outputs["checkpoint"]) == b"w"
    gate = threading.Event()
    store.behind.submit("held", lambda: gate.wait(10))  # the writer thread busy: what follows waits for it
    m = run_stage(store, "r", 1, "train", "h", {}, body)
    assert not (tmp_path / "r" / "iter-0001" / "train" / "model.bin").exists()  # left to the commit
    gate.set()
    assert store.read_bytes(m.outputs["checkpoint"]) == b"w"
