"""State files that cannot carry code: tensors in safetensors, everything else as plain JSON beside them.

An optimizer's or a critic's state is a tree (dicts, lists, numbers, strings, tensors). ``torch.save`` writes
it as a pickle, and reading a pickle runs whatever the file names: anyone who can write the store (and the
manifest that holds its sha256, which lives in the same bucket) could run code in the trainer. Here the tree
is written as one safetensors file: the tensors under generated names, the rest of the tree as JSON in the
file's metadata (``rlfoundry.tree``: one key, so that the bytes are the same in every process), a tensor's
place holding ``{"$tensor": NAME}``. Reading it parses a JSON header and copies bytes into tensors; nothing
is imported, nothing is called. A file that is not of this form (a pickle planted in the store, a truncated
upload) is refused with an error that names it.

    data = dumps({"step": 3, "exp_avg": {"w": torch.zeros(2)}})
    tree = loads(data, "s3://bucket/run/iter-0002/train/optimizer.safetensors")

JSON has no integer keys and no tuples, which optimizer state dicts use (``state[0]``, ``betas``): they are
written tagged (``{"$dict": [[key, value], ...]}``, ``{"$tuple": [...]}``) and come back as they were.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

FORMAT = "rlfoundry-state-v1"
TREE_KEY = "rlfoundry.tree"
MAX_HEADER = 100 << 20  # a header of more than 100 MB is no state file of ours


class StateFileError(ValueError):
    """A state file that is not a safetensors state tree (or not a readable one)."""


def _encode(obj: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        # one storage per tensor (safetensors refuses shared memory), on the CPU, in one piece
        tensors[name] = obj.detach().to("cpu").contiguous().clone()
        return {"$tensor": name}
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"$float": repr(obj)}
    if isinstance(obj, tuple):
        return {"$tuple": [_encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: _encode(v, tensors, f"{path}.{k}") for k, v in obj.items()}
        items = []
        for k, v in obj.items():
            if not (k is None or isinstance(k, bool | int | float | str)):
                raise TypeError(f"state {path}: a key of type {type(k).__name__} cannot be stored")
            items.append([k, _encode(v, tensors, f"{path}[{k!r}]")])
        return {"$dict": items}
    raise TypeError(
        f"state {path}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be stored as plain data"
    )


def dumps(tree: Any) -> bytes:
    """``tree`` as the bytes of one safetensors file (see the module's docstring). Raises TypeError naming
    the first value that is neither plain data nor a tensor."""
    tensors: dict[str, torch.Tensor] = {}
    encoded = _encode(tree, tensors, "$")
    # One metadata key: safetensors writes its metadata map in no fixed order, and a state file must be the
    # same bytes every time (a replayed train stage is compared byte for byte).
    body = {"format": FORMAT, "tree": encoded}
    return save_tensors(
        tensors, metadata={TREE_KEY: json.dumps(body, allow_nan=False, separators=(",", ":"))}
    )


def _parsed_header(data: bytes) -> tuple[Any, str]:
    """(the safetensors header as JSON, "") or (None, why there is none)."""
    if len(data) < 8:
        return None, f"{len(data)} bytes, too short for a safetensors state file"
    (size,) = struct.unpack("<Q", data[:8])
    if size > min(MAX_HEADER, len(data) - 8):
        return None, f"not a safetensors state file (header length {size} does not fit)"
    try:
        return json.loads(data[8 : 8 + size]), ""
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"not a safetensors state file (header: {e})"


def _header(data: bytes, what: str) -> dict[str, Any]:
    header, why = _parsed_header(data)
    # A safetensors file opens with its header's length (8 bytes, little-endian), whose first byte may be
    # anything, 0x80 included: the pickle signatures (a zip, or protocol 2+'s 0x80) are looked for only where
    # no header parses.
    if why and (data[:2] == b"PK" or data[:1] == b"\x80"):
        raise StateFileError(
            f"{what}: a pickle (torch.save) file, not a safetensors state file: refused, since reading a "
            "pickle runs whatever code it names (rlfoundry writes its state as safetensors + JSON)"
        )
    if why:
        raise StateFileError(f"{what}: {why}")
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    try:
        body = json.loads(meta[TREE_KEY]) if isinstance(meta, dict) and TREE_KEY in meta else None
    except (TypeError, json.JSONDecodeError):
        body = None
    if not isinstance(body, dict) or body.get("format") != FORMAT or "tree" not in body:
        raise StateFileError(f"{what}: a safetensors file, but not an rlfoundry state file ({FORMAT})")
    return body


def _decode(obj: Any, tensors: dict[str, torch.Tensor], what: str) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, what) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        ((tag, value),) = obj.items()
        if tag == "$tensor":
            if value not in tensors:
                raise StateFileError(f"{what}: the tree names a tensor {value!r} the file does not hold")
            return tensors[value]
        if tag == "$tuple":
            return tuple(_decode(v, tensors, what) for v in value)
        if tag == "$float":
            if value not in ("nan", "inf", "-inf"):
                raise StateFileError(f"{what}: {value!r} is no float")
            return float(value)
        if tag == "$dict":
            return {k: _decode(v, tensors, what) for k, v in value}
    return {k: _decode(v, tensors, what) for k, v in obj.items()}


def loads(data: bytes, what: str = "state file") -> Any:
    """The tree ``dumps`` wrote; ``what`` (the file's URI) names it in errors. Refuses anything else — a
    pickle above all — with ``StateFileError``; never imports or calls anything the file names."""
    body = _header(data, what)
    try:
        return _decode(body["tree"], load_tensors(data), what)
    except StateFileError:
        raise
    except Exception as e:  # noqa: BLE001 (a corrupt file, said as such)
        raise StateFileError(f"{what}: a corrupt state file ({type(e).__name__}: {e})") from None
