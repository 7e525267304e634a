"""State files from the store cannot run code (rl_core.artifacts.safe_state): what the trainer writes
round-trips bit for bit, and anything else — a pickle above all — is refused with an error naming the file,
its payload never run."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as save_tensors

from rl_core.artifacts import safe_state
from rl_core.artifacts.safe_state import StateFileError
from rl_core.training.train_engine import TorchTrainEngine

URI = "s3://bucket/runs/r/iter-0002/train/optimizer.safetensors"


class Payload:
    """Unpickling this runs ``os.system`` (it writes the marker file): what a planted state file would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _planted(marker: Path) -> dict[str, bytes]:
    """The ways a pickle can be planted where a state file is read: torch.save's zip, raw pickles of every
    protocol (protocol 0 and 1 do not start with a protocol byte), inside a tensor-looking dict."""
    out = {}
    buf = io.BytesIO()
    torch.save({"state": {}, "x": Payload(marker)}, buf)
    out["torch.save"] = buf.getvalue()
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        out[f"pickle-{proto}"] = pickle.dumps({"exp_avg": Payload(marker)}, protocol=proto)
    # a pickle behind a forged 8-byte length, as if it were a safetensors header
    body = pickle.dumps(Payload(marker), protocol=0)
    out["forged-length"] = struct.pack("<Q", len(body)) + body
    return out


def test_a_planted_pickle_is_refused_and_its_payload_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(Payload(marker)))  # the payload works when unpickled...
    assert marker.exists()
    marker.unlink()
    for name, data in _planted(marker).items():
        with pytest.raises(StateFileError) as err:
            safe_state.loads(data, URI)
        assert URI in str(err.value), name
        assert not marker.exists(), f"{name}: the payload ran"
    engine = TorchTrainEngine(torch.nn.Linear(2, 2), _cfg())
    for data in _planted(marker).values():  # ...and never through the engine's loader either
        with pytest.raises(StateFileError):
            engine.load_optimizer_state(data, URI)
    assert not marker.exists()


@pytest.mark.parametrize(
    "data, says",
    [
        (b"", "too short"),
        (b"\x00" * 7, "too short"),
        (struct.pack("<Q", 1 << 40) + b"{}", "does not fit"),
        (struct.pack("<Q", 5) + b"nojson", "header"),
        (save_tensors({"w": torch.zeros(2)}), "not an rlfoundry state file"),
        (save_tensors({"w": torch.zeros(2)}, metadata={"format": "other"}), "not an rlfoundry state file"),
        (
            save_tensors({"w": torch.zeros(2)}, metadata={"rlfoundry.tree": "{}"}),
            "not an rlfoundry state file",
        ),
    ],
    ids=["empty", "short", "huge-header", "bad-json", "no-metadata", "other-format", "no-format"],
)
def test_what_is_not_a_state_file_is_refused_by_name(data: bytes, says: str) -> None:
    with pytest.raises(StateFileError, match=says) as err:
        safe_state.loads(data, URI)
    assert URI in str(err.value)


def test_a_truncated_or_tampered_state_file_is_refused() -> None:
    good = safe_state.dumps({"exp_avg": {"w": torch.arange(6.0)}})
    with pytest.raises(StateFileError, match="corrupt"):
        safe_state.loads(good[:-5], URI)
    # the tree names a tensor the file does not hold
    (size,) = struct.unpack("<Q", good[:8])
    header = json.loads(good[8 : 8 + size])
    forged_tree = {"format": safe_state.FORMAT, "tree": {"x": {"$tensor": "t9"}}}
    header["__metadata__"][safe_state.TREE_KEY] = json.dumps(forged_tree)
    forged = json.dumps(header).encode()
    forged += b" " * (-len(forged) % 8)
    with pytest.raises(StateFileError, match="t9"):
        safe_state.loads(struct.pack("<Q", len(forged)) + forged + good[8 + size :], URI)


def test_optimizer_and_critic_trees_round_trip_bit_for_bit() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    tree = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),  # int keys, tuples (betas), None and bool options
        "odd": {"$x": 1, 2.5: [float("nan"), float("-inf")], None: (True, "s")},
        "bf16": torch.randn(3, 2).to(torch.bfloat16),
        "view": torch.arange(10.0)[2:7:2],  # a strided view of a larger storage
    }
    back = safe_state.loads(safe_state.dumps(tree), URI)
    sd, got = opt.state_dict(), back["optimizer"]
    assert got["param_groups"] == sd["param_groups"] and isinstance(got["param_groups"][0]["betas"], tuple)
    assert sorted(got["state"]) == sorted(sd["state"]) == [0, 1, 2, 3]
    for k, s in sd["state"].items():
        for name, t in s.items():
            assert got["state"][k][name].dtype == t.dtype and torch.equal(got["state"][k][name], t), (k, name)
    assert all(torch.equal(back["model"][k], v) for k, v in model.state_dict().items())
    assert back["bf16"].dtype == torch.bfloat16 and torch.equal(back["bf16"], tree["bf16"])
    assert torch.equal(back["view"], torch.tensor([2.0, 4.0, 6.0]))
    odd = back["odd"]
    assert odd["$x"] == 1 and odd[None] == (True, "s")
    assert odd[2.5][0] != odd[2.5][0] and odd[2.5][1] == float("-inf")


def test_the_same_state_is_the_same_bytes_in_any_process() -> None:
    """A replayed train stage is compared byte for byte with the stored one: the file must not depend on the
    process (safetensors writes a metadata map in no fixed order; there is one key)."""
    import subprocess
    import sys

    code = (
        "import sys, torch, hashlib; from rl_core.artifacts import safe_state; "
        "t = {'format': 'x', 'step': 3, 'exp_avg': {'a': torch.arange(4.0), 'b': torch.ones(2, 2)}}; "
        "sys.stdout.write(hashlib.sha256(safe_state.dumps(t)).hexdigest())"
    )
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout for _ in range(4)
    }
    assert len(digests) == 1 and len(next(iter(digests))) == 64, digests


def test_objects_that_would_need_a_pickle_are_not_written() -> None:
    with pytest.raises(TypeError, match=r"\$\.optimizer\.scaler: a .*Payload"):
        safe_state.dumps({"optimizer": {"scaler": Payload(Path("/nonexistent"))}})


class _Cfg:
    lr, weight_decay, grad_clip = 1e-2, 0.0, 1.0


def _cfg() -> _Cfg:
    return _Cfg()


def test_a_reloaded_optimizer_continues_bit_for_bit() -> None:
    """Two steps in one engine against one step, the state through bytes, a fresh engine, then the second."""

    def fresh() -> TorchTrainEngine:
        torch.manual_seed(1)
        return TorchTrainEngine(torch.nn.Linear(4, 3), _cfg())

    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))

    def step(engine: TorchTrainEngine) -> None:
        engine.backward_step((engine.module(x) ** 2).mean())

    straight = fresh()
    step(straight)
    step(straight)
    first = fresh()
    step(first)
    data = first.optimizer_state()
    assert data[:8] != b"PK\x03\x04" and safe_state.loads(data)["state"]
    second = fresh()
    second.module.load_state_dict(first.weights())
    second.load_optimizer_state(data, URI)
    step(second)
    for k, v in straight.weights().items():
        assert torch.equal(second.weights()[k], v), k


@pytest.mark.parametrize("low", [b"\x80", b"PK"])
def test_a_state_whose_header_length_spells_a_pickle_signature_still_loads(low: bytes) -> None:
    """A safetensors file opens with its header's length: 0x80 (or "PK") as its low byte(s) is a valid
    length (1 state file in 256 has it), not a pickle."""
    for pad in range(20_000):  # the length grows by one per character (to 8-byte steps): 0x80, 0x4B50
        data = safe_state.dumps({"step": 3, "note": "x" * pad, "t": torch.arange(3.0)})
        if data.startswith(low):
            break
    else:
        pytest.fail(f"no header length starting {low!r} within 20,000 paddings")
    tree = safe_state.loads(data, "opt")
    assert tree["step"] == 3 and torch.equal(tree["t"], torch.arange(3.0))
