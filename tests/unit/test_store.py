"""Artifact store: hashes, atomic manifests, corrupt artifacts reported with their path and never consumed."""

import pickle
from pathlib import Path

import pandas as pd
import pytest

from rl_core.artifacts.manifest import ArtifactRef, Manifest, Timings
from rl_core.artifacts.stage import StageResult, run_stage
from rl_core.artifacts.store import ArtifactError, Store


def test_table_roundtrip_and_hash(tmp_path):
    s = Store(str(tmp_path))
    df = pd.DataFrame({"a": [1, 2], "ids": [[1, 2], [3]]})
    ref = s.write_table(s.stage_uri("r", 1, "generate") + "/t.parquet", df)
    assert ref.uri.startswith("file://") and "iter-0001/generate" in ref.uri
    back = s.read_table(ref)
    assert back["a"].tolist() == [1, 2] and list(back["ids"][0]) == [1, 2]
    assert ref.rows == 2


def test_a_table_read_again_is_verified_again_and_is_a_copy(tmp_path):
    """The parse cache: a second read gives an equal table that is not the first one, and a table changed
    on disk after its first read is still reported corrupt (the bytes are read and hashed every time)."""
    s = Store(str(tmp_path))
    ref = s.write_table(s.root + "/r/t.parquet", pd.DataFrame({"a": [1, 2], "ids": [[1, 2], [3]]}))
    first = s.read_table(ref)
    first.loc[0, "a"] = 99
    again = s.read_table(ref)
    assert again["a"].tolist() == [1, 2] and list(again["ids"][1]) == [3]
    assert list(s.parsed.items) == [ref.sha256]  # parsed once, held by this store only
    assert not Store(str(tmp_path)).parsed.items
    assert not pickle.loads(pickle.dumps(s)).parsed.items  # a store sent to another process starts empty
    path = tmp_path / "r" / "t.parquet"
    path.write_bytes(path.read_bytes()[:-1] + b"X")
    with pytest.raises(ArtifactError, match=r"corrupt: .*r/t\.parquet"):
        s.read_table(ref)
    path.unlink()
    with pytest.raises(ArtifactError, match=r"missing: .*r/t\.parquet"):
        s.read_table(ref)


def test_corrupt_artifact_is_detected_with_path(tmp_path):
    s = Store(str(tmp_path))
    ref = s.write_bytes(s.root + "/r/x.bin", b"hello")
    (tmp_path / "r" / "x.bin").write_bytes(b"hellO")
    with pytest.raises(ArtifactError, match=r"corrupt: .*r/x\.bin"):
        s.read_bytes(ref)


def test_missing_artifact_names_uri(tmp_path):
    s = Store(str(tmp_path))
    with pytest.raises(ArtifactError, match="missing: .*nope"):
        s.read_bytes(ArtifactRef(uri=s.root + "/nope", sha256="0" * 64))


def test_checkpoint_folder_verified(tmp_path):
    s = Store(str(tmp_path / "store"))
    src = tmp_path / "ck"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"w1")
    (src / "config.json").write_text("{}")
    ref = s.put_dir(src, s.root + "/r/ck")
    assert sorted(ref.files) == ["config.json", "model.safetensors"]
    assert s.local_dir(ref, tmp_path / "cache").is_dir()
    (tmp_path / "store" / "r" / "ck" / "model.safetensors").write_bytes(b"w2")
    with pytest.raises(ArtifactError, match="model.safetensors"):
        s.local_dir(ref, tmp_path / "cache")
    with pytest.raises(ArtifactError, match="not a folder"):
        s.local_dir(ref.model_copy(update={"files": None}), tmp_path / "cache")


def test_a_verified_folder_is_hashed_again_only_when_a_file_changed(tmp_path, monkeypatch):
    """A local folder is hashed once while its files' stats stay as verified (the stages read a checkpoint
    several times); a file rewritten in place to the same size, a replaced or a missing one is still
    reported; files written in the last moments are hashed at every read (their mtime tick may not have
    moved); a store sent to another process starts without what this one verified."""
    import os
    import time

    import rl_core.artifacts.store as store_mod

    s = Store(str(tmp_path / "store"))
    ref = s.put_files({"model.safetensors": b"w1", "config.json": b"{}"}, s.root + "/r/ck")
    folder = tmp_path / "store" / "r" / "ck"
    hashed: list[str] = []
    real = store_mod.sha256_file
    monkeypatch.setattr(store_mod, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    s.local_dir(ref, tmp_path / "cache")
    s.local_dir(ref, tmp_path / "cache")
    assert len(hashed) == 4 and not s.verified.items  # just written: hashed at every read
    old = time.time() - 10
    for f in folder.iterdir():
        os.utime(f, (old, old))
    hashed.clear()
    for _ in range(3):
        assert s.local_dir(ref, tmp_path / "cache") == folder
    assert sorted(hashed) == ["config.json", "model.safetensors"]  # once, then trusted
    assert not pickle.loads(pickle.dumps(s)).verified.items
    (folder / "model.safetensors").write_bytes(b"w2")  # in place, same size
    with pytest.raises(ArtifactError, match=r"corrupt: .*r/ck/model\.safetensors"):
        s.local_dir(ref, tmp_path / "cache")
    s.write_bytes(s.root + "/r/ck/model.safetensors", b"w1")  # replaced by the right bytes: fine again
    assert s.local_dir(ref, tmp_path / "cache") == folder
    (folder / "config.json").unlink()
    with pytest.raises(ArtifactError, match=r"missing: .*r/ck/config\.json"):
        s.local_dir(ref, tmp_path / "cache")


def _age(*files: Path) -> None:
    """Set the files' mtime 10 s back: written well before the next read (``memo.SETTLE_NS``)."""
    import os
    import time

    old = time.time() - 10
    for f in files:
        os.utime(f, (old, old))


def test_a_manifest_or_table_unchanged_since_its_read_is_not_read_again(tmp_path, monkeypatch):
    """Local manifests and tables read before are not opened again while their stats are those they were read
    with (``Store.seen``): each reader still gets its own objects; one just written is read every time; one
    rewritten in place (same size), replaced, corrupted or removed is read again and reported; a store sent
    to another process starts without them."""
    s = Store(str(tmp_path))
    uri = s.stage_uri("r", 1, "train")
    ran = run_stage(s, "r", 1, "train", "c", {}, lambda job: StageResult(outputs={}, metrics={"loss": 1.5}))
    ref = s.write_table(s.root + "/r/t.parquet", pd.DataFrame({"a": [1, 2]}))
    reads: list[str] = []
    real = s.read_bytes
    monkeypatch.setattr(s, "read_bytes", lambda r: reads.append(getattr(r, "uri", r)) or real(r))
    for _ in range(2):  # just written: read each time
        assert s.read_manifest(uri).metrics == {"loss": 1.5} and s.read_table(ref)["a"].tolist() == [1, 2]
    assert len(reads) == 4
    manifest, table = tmp_path / "r" / "iter-0001" / "train" / "_manifest.json", tmp_path / "r" / "t.parquet"
    _age(manifest, table)
    reads.clear()
    first = s.read_manifest(uri)
    first.metrics["loss"] = 9.0
    for _ in range(3):
        again = s.read_manifest(uri)
        assert again == ran.model_copy(update={"metrics": {"loss": 1.5}}) and again is not first
        assert s.read_table(ref)["a"].tolist() == [1, 2]
    assert len(reads) == 2  # once each, then by their stats
    assert len(s.seen.memo.items) == 2
    monkeypatch.delattr(s, "read_bytes")
    assert not pickle.loads(pickle.dumps(s)).seen.memo.items
    manifest.write_text(manifest.read_text().replace('"loss": 1.5', '"loss": 2.5'))  # in place, same size
    assert s.read_manifest(uri).metrics == {"loss": 2.5}
    table.write_bytes(table.read_bytes()[:-1] + b"X")
    with pytest.raises(ArtifactError, match=r"corrupt: .*r/t\.parquet"):
        s.read_table(ref)
    manifest.write_text("{not json")
    _age(manifest)
    with pytest.raises(ArtifactError, match="manifest corrupt"):
        s.read_manifest(uri)
    manifest.unlink()
    assert s.read_manifest(uri) is None


def test_run_stage_commits_then_skips(tmp_path):
    s = Store(str(tmp_path))
    calls = []

    def body(job):
        calls.append(job.out_uri)
        return StageResult(outputs={"x": s.write_bytes(job.out_uri + "/x", b"1")}, metrics={"m": 1.0})

    m1 = run_stage(s, "r", 1, "generate", "h", {}, body)
    m2 = run_stage(s, "r", 1, "generate", "h", {}, body)
    assert len(calls) == 1 and m2.reused and not m1.reused
    assert m2.outputs == m1.outputs
    # a committed stage is never cleared (issue 21 item 1): another config or other inputs are refused,
    # naming the stage, unless the config is one the run records (accepted), and it is still there
    with pytest.raises(ArtifactError, match=r"iter-0001/generate is committed with a config"):
        run_stage(s, "r", 1, "generate", "h2", {}, body)
    assert run_stage(s, "r", 1, "generate", "h2", {}, body, accepted={"h"}).reused
    with pytest.raises(ArtifactError, match="other inputs"):
        run_stage(s, "r", 1, "generate", "h", {"policy": m1.outputs["x"]}, body)
    assert len(calls) == 1 and s.read_bytes(m1.outputs["x"]) == b"1"


def test_crashed_stage_leftovers_are_cleared(tmp_path):
    s = Store(str(tmp_path))
    uri = s.stage_uri("r", 1, "train")
    s.write_bytes(uri + "/partial.bin", b"half")  # a crash before the manifest

    def body(job):
        return StageResult(outputs={"y": s.write_bytes(job.out_uri + "/y", b"2")})

    run_stage(s, "r", 1, "train", "h", {}, body)
    assert not s.exists(uri + "/partial.bin")
    assert s.read_manifest(uri).outputs["y"].uri.endswith("/y")


def test_corrupt_manifest_reported(tmp_path):
    s = Store(str(tmp_path))
    uri = s.stage_uri("r", 1, "train")
    s.write_bytes(uri + "/_manifest.json", b"{not json")
    with pytest.raises(ArtifactError, match="manifest corrupt: .*_manifest.json"):
        s.read_manifest(uri)


def test_diff_tables_counts_rows_and_columns():
    from rl_core.pipeline.replay import diff_tables

    a = pd.DataFrame({"x": [1, 2, 3], "ids": [[1], [2], [3]], "y": ["a", "b", "c"]})
    b = a.copy()
    assert diff_tables(a, b) == {"identical": True, "rows": 3, "rows_changed": 0, "columns_changed": []}
    b.loc[1, "x"] = 9
    b.at[2, "ids"] = [4]
    d = diff_tables(a, b)
    assert d["identical"] is False and d["rows_changed"] == 2 and d["columns_changed"] == ["x", "ids"]
    assert diff_tables(a, a.iloc[:2])["identical"] is False


@pytest.mark.parametrize(
    "where",
    [
        "file:///etc/rlfoundry-x",  # another place on the machine
        "{root}-sibling/x",  # a folder whose name starts like the root's
        "{root}/../x",
        "{root}/r/./x",
        "{root}/r/..\\..\\x",
        "s3://other-bucket/runs/x",  # another protocol or bucket
        "x",  # a relative path
    ],
)
def test_no_uri_outside_the_root_is_read_written_or_removed(tmp_path, where):
    """Item 8 of issue 21: the store refuses every URI outside its root — whether a caller built it or it was
    read from a tampered manifest — for writes, reads, folder copies and removals, and touches nothing."""
    s = Store(str(tmp_path / "store"))
    s.write_bytes(s.root + "/r/keep.bin", b"kept")
    (tmp_path / "x").write_bytes(b"outside")
    uri = where.format(root=s.root)
    before = sorted(p for p in tmp_path.rglob("*"))
    for op in (
        lambda: s.write_bytes(uri, b"planted"),
        lambda: s.read_bytes(uri),
        lambda: s.read_bytes(ArtifactRef(uri=uri, sha256="0" * 64)),
        lambda: s.exists(uri),
        lambda: s.clear(uri),
        lambda: s.local_dir(ArtifactRef(uri=uri, sha256="0" * 64, files={"a": "0" * 64}), tmp_path),
    ):
        with pytest.raises(ArtifactError, match="outside the store"):
            op()
    assert sorted(p for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "x").read_bytes() == b"outside"
    assert s.read_bytes(s.root + "/r/keep.bin") == b"kept"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sha256", "/tmp/victim"),
        ("sha256", "../../victim"),
        ("sha256", "A" * 64),
        ("files", {"/etc/passwd": "0" * 64}),
        ("files", {"../../outside.bin": "0" * 64}),
        ("files", {"a/../../b": "0" * 64}),
        ("files", {"a": "../x"}),
    ],
)
def test_a_hand_edited_reference_cannot_name_a_place_outside(tmp_path, field, value):
    """A manifest's checkpoint reference whose ``sha256`` (a cache folder's name) is a path, or whose
    ``files`` keys climb out of the folder, is reported as a corrupt manifest when read: no cache folder is
    removed or written, no file outside the store is hashed."""
    s = Store(str(tmp_path / "store"))
    ref = s.put_files({"model.safetensors": b"weights"}, s.stage_uri("r", 1, "train") + "/checkpoint")
    m = Manifest(
        run_id="r",
        iteration=1,
        stage="train",
        inputs={},
        outputs={"checkpoint": ref},
        config_hash="h",
        code_version="c",
        timings=Timings(seconds=0.0, started_at=0.0),
    )
    doc = m.model_dump(mode="json")
    doc["outputs"]["checkpoint"][field] = value
    s.write_json(s.stage_uri("r", 1, "train") + "/_manifest.json", doc)
    with pytest.raises(ArtifactError, match="manifest corrupt"):
        s.read_manifest(s.stage_uri("r", 1, "train"))


def test_a_remote_folder_whose_files_do_not_give_its_digest_is_refused(tmp_path):
    """On a store that is not a local folder (``memory://`` standing in for S3), a reference whose files'
    hashes do not give its ``sha256`` is refused before anything is downloaded: the cache folder of that
    digest, if one exists, is neither removed nor replaced."""
    import uuid

    s = Store(f"memory://store-{uuid.uuid4().hex}")
    ref = s.put_files({"model.safetensors": b"weights"}, s.stage_uri("r", 1, "train") + "/checkpoint")
    other = "ab" * 32
    kept = tmp_path / other
    kept.mkdir()
    (kept / "precious.txt").write_text("keep me")
    with pytest.raises(ArtifactError, match="do not give its sha256"):
        s.local_dir(ref.model_copy(update={"sha256": other}), tmp_path)
    assert sorted(p.name for p in kept.iterdir()) == ["precious.txt"]
    assert (s.local_dir(ref, tmp_path) / "model.safetensors").read_bytes() == b"weights"
