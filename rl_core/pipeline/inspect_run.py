"""Look inside a run from its manifests: sample rollouts of an iteration, walk a checkpoint's lineage.

samples(store, run_id, iteration=3, k=3)   # best, worst and random rollouts with rewards and outcomes
lineage(store, run_id, iteration=3)        # checkpoint <- rollouts, rewards, parent checkpoint <- ...
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rl_core.artifacts.manifest import Manifest
from rl_core.artifacts.store import MANIFEST, ArtifactError, Store
from rl_core.models.model import weights_digest


def _manifest(store: Store, run_id: str, iteration: int, stage: str) -> Manifest:
    m = store.read_manifest(store.stage_uri(run_id, iteration, stage))
    if m is None:
        raise FileNotFoundError(f"run {run_id} has no committed {stage} stage at iteration {iteration}")
    return m


def samples(
    store: Store, run_id: str, iteration: int, k: int = 3, image_dir: str | Path | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The ``k`` best, ``k`` worst and ``k`` random completions of an iteration (by reward).

    Multimodal rollouts carry the prompt's image: it is written to ``image_dir`` as PNG (the row then names
    the file), or summarised as ``<image: N bytes>``."""
    gen = _manifest(store, run_id, iteration, "generate")
    df = store.read_table(gen.outputs["rollouts"])
    env_m = store.read_manifest(store.stage_uri(run_id, iteration, "execute_envs"))
    rew_m = store.read_manifest(store.stage_uri(run_id, iteration, "score_rewards"))
    if env_m is not None:
        env = store.read_table(env_m.outputs["env_results"]).drop(columns=["prompt_index", "sample_index"])
        df = df.join(env.add_prefix("env_"))
    if rew_m is not None:
        rew = store.read_table(rew_m.outputs["rewards"]).drop(columns=["prompt_index", "sample_index"])
        df = df.join(rew)
    keep = [c for c in df.columns if c not in ("prompt_ids", "completion_ids", "logprobs", "loss_mask")]
    view = df[keep]
    if "reward" in view:
        ordered = view.sort_values(
            ["reward", "prompt_index", "sample_index"], ascending=[False, True, True], kind="stable"
        )
    else:
        ordered = view
    rng = random.Random(f"{run_id}:{iteration}")
    picks = sorted(rng.sample(range(len(view)), min(k, len(view))))

    def rows(frame: Any, name: str) -> list[dict[str, Any]]:
        out = []
        for r in frame.to_dict("records"):
            row = {c: (v.item() if hasattr(v, "item") else v) for c, v in r.items()}
            if isinstance(row.get("image"), bytes | bytearray):
                data = bytes(row["image"])
                row["image"] = f"<image: {len(data)} bytes>"
                if image_dir is not None:
                    f = Path(image_dir) / f"{name}-{row['prompt_index']}-{row['sample_index']}.png"
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_bytes(data)
                    row["image"] = str(f)
            out.append(row)
        return out

    return {
        "best": rows(ordered.head(k), "best"),
        "worst": rows(ordered.tail(k)[::-1], "worst"),
        "random": rows(view.iloc[picks], "random"),
    }


@contextlib.contextmanager
def _complete(store: Store, run_id: str, iteration: int, stage: str) -> Iterator[None]:
    """A manifest without an entry lineage reads (a tampered or foreign one) is an ArtifactError naming it."""
    try:
        yield
    except (KeyError, TypeError) as e:
        uri = f"{store.stage_uri(run_id, iteration, stage)}/{MANIFEST}"
        what = f"has no {e}" if isinstance(e, KeyError) else f"is malformed ({e})"
        raise ArtifactError(f"manifest {uri} {what}, which a checkpoint's lineage needs") from e


def lineage(store: Store, run_id: str, iteration: int) -> list[dict[str, Any]]:
    """From the checkpoint train wrote at ``iteration`` back to the base model, one entry per checkpoint; a
    manifest that lacks what this reads is an ArtifactError naming it."""
    chain = []
    for k in range(iteration, 0, -1):
        tr = _manifest(store, run_id, k, "train")
        rew = _manifest(store, run_id, k, "score_rewards")
        with _complete(store, run_id, k, "score_rewards"):
            env_results = rew.inputs["env_results"].uri
        with _complete(store, run_id, k, "train"):
            chain.append(
                {
                    "iteration": k,
                    "checkpoint": tr.outputs["checkpoint"].uri,
                    # False between train.checkpoint_every points: rebuilt from the last stored one on demand
                    "checkpoint_stored": tr.outputs["checkpoint"].stored is not False,
                    "policy_sha256": tr.metrics["policy_sha256"],
                    "parent_checkpoint": tr.inputs["policy"].uri,
                    "rollouts": tr.inputs["rollouts"].uri,
                    "rewards": tr.inputs["rewards"].uri,
                    "env_results": env_results,
                    "optimizer_state": tr.inputs["optimizer"].uri if "optimizer" in tr.inputs else None,
                }
            )
    from rl_core.run.runs import load_run

    base = load_run(store, run_id)["base_id"]
    wu = _manifest(store, base, 0, "warmup")
    with _complete(store, base, 0, "warmup"):
        chain.append(
            {
                "iteration": 0,
                "checkpoint": wu.outputs["checkpoint"].uri,
                "policy_sha256": weights_digest(wu.outputs["checkpoint"].files),
                "parent_checkpoint": wu.inputs["checkpoint"].uri,
                "note": "warmed-up base model (supervised warm-up of the init checkpoint)",
            }
        )
    return chain
