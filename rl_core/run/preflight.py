"""Checks a run passes before any stage runs, where the user's own model folder meets the user's own data:
the longest prompt of the task, as the policy sees it (chat template applied, image placeholders included),
plus ``rollout.max_tokens`` must fit ``model.max_position`` and the folder's ``max_position_embeddings``.
Otherwise the engine would refuse the prompt mid-run (vLLM: "maximum context length is 64 tokens ... 67
input tokens"), after stages had committed.

    check_prompts_fit(ctx)   # ConfigError, one line: the prompt, its length, the field to set, the limit

``rl_core.run.runs.create_or_resume`` calls it for a new run and for a resume (a ``--set`` may change the
lengths); the built-in policy (no ``model.path``) builds its tokenizer from its own tasks and is not checked.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from rl_core.schema.config import ConfigError


class PromptTooLong(ConfigError):
    """The task's longest prompt and its completion do not fit the policy's context."""


def longest_prompt(ctx: Any, folder: Path) -> tuple[int, str]:
    """(tokens, which row) of the task's longest prompt as the policy at ``folder`` sees it: training and
    held-out rows, each as the environment's ``reset`` gives it, through ``model.chat_template``, with an
    image's placeholders where the environment shows one."""
    from envs.base import Multimodal
    from rl_core.models.model import load_tokenizer, prompt_ids

    tok = load_tokenizer(folder)
    extra = 0
    if isinstance(ctx.env, Multimodal) and ctx.multimodal:
        from rl_core.models.vision import image_prefix

        extra = len(image_prefix(folder))
    best, where = 0, ""
    for split, tasks in (("train", ctx.train_tasks), ("heldout", ctx.heldout_tasks)):
        for i, task in enumerate(tasks):
            n = len(prompt_ids(tok, ctx.env.reset(task, 0), ctx.cfg.model.chat_template)) + extra
            if n > best:
                best, where = n, f"{split} row {i}"
    return best, where


def _folder_limit(folder: Path) -> int | None:
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    limit = data.get("text_config", data).get("max_position_embeddings")
    return int(limit) if limit else None


def check_prompts_fit(ctx: Any) -> None:
    """Refuse (``PromptTooLong``) a run whose longest templated prompt plus ``rollout.max_tokens`` exceeds
    ``model.max_position`` or the folder's ``max_position_embeddings``; nothing for the built-in policy."""
    cfg = ctx.cfg
    if not cfg.model.path:
        return
    from rl_core.models.policy_folder import fetch_policy_folder

    with tempfile.TemporaryDirectory() as d:
        folder = fetch_policy_folder(cfg.model.path, d, large=False)
        tokens, where = longest_prompt(ctx, folder)
        limit = _folder_limit(folder)
    need = tokens + cfg.rollout.max_tokens
    prompt = (
        f"the longest prompt of task.env={cfg.task.env} ({where}) is {tokens} tokens as the policy sees "
        f"it; with rollout.max_tokens={cfg.rollout.max_tokens} a sequence needs {need}"
    )
    if limit is not None and need > limit:
        raise PromptTooLong(
            f"{prompt}, more than model.path's max_position_embeddings={limit}: shorten the prompts or "
            "lower rollout.max_tokens"
        )
    if need > cfg.model.max_position:
        folder_says = f" (model.path's max_position_embeddings: {limit})" if limit else ""
        raise PromptTooLong(
            f"{prompt} > model.max_position={cfg.model.max_position}: set model.max_position to at least "
            f"{need}{folder_says}"
        )


def check_ray_address(cfg: Any, timeout_s: float = 3.0) -> None:
    """Refuse (``ConfigError``, one line) a ``task.ray_address`` or ``cluster.ray_address`` that nothing
    answers on, before any stage: the run would otherwise fail in its first execute_envs or train stage,
    after earlier stages had committed."""
    named = [("cluster.ray_address", cfg.cluster.ray_address)]
    if cfg.task.executor == "ray":
        named.append(("task.ray_address", cfg.task.ray_address))
    for field, address in named:
        if address and address != "auto":
            _answers(field, address, timeout_s)


def _answers(field: str, address: str, timeout_s: float) -> None:
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(address if "://" in address else f"ray://{address}")
    host, port = parts.hostname, parts.port or (10001 if parts.scheme == "ray" else 6379)
    try:
        with socket.create_connection((host or "", port), timeout=timeout_s):
            pass
    except OSError as e:
        raise ConfigError(
            f"{field}={address}: nothing answers on {host}:{port} ({e.strerror or e}); start the cluster "
            "(ray start --head), fix the address, or leave it empty"
        ) from None


def check_cluster_resources(ctx: Any) -> None:
    """Refuse (``ConfigError``, one line) a cluster that has fewer CPUs (GPUs on a GPU machine) than the run's
    actors take together, naming what it has: a launched train stage's ranks (one CPU each), the rollout
    engines (``rollout.servers``: one CPU each, and each its GPUs on a GPU machine) and the environment
    workers (``task.env_workers`` with ``task.executor: ray``: one CPU each), which live beside the ranks.
    Then the ranks, placed as the train stage places them, must each reach rank 0's rendezvous port. Joined
    now, before any stage."""
    cfg = ctx.cfg
    ranks = cfg.train.world_size if cfg.train.launched else 0
    engines = cfg.rollout.servers if not cfg.rollout.server_urls else 0
    env_workers = cfg.task.env_workers if cfg.task.executor == "ray" and not cfg.task.ray_address else 0
    if not cfg.cluster.ray_address or not (ranks or engines or env_workers):
        return
    import ray

    from rl_core.run.cluster import connect

    connect(cfg.cluster.ray_address, cfg.task.env)
    have = ray.cluster_resources()
    need = {"CPU": float(ranks + engines + env_workers)}
    gpus = (ranks if ctx.placement.trainer_gpus else 0) + sum(len(g) for g in ctx.placement.server_gpus)
    if gpus:
        need["GPU"] = float(gpus)
    short = {k: v for k, v in need.items() if have.get(k, 0.0) < v}
    if short:
        has = ", ".join(f"{k} {have.get(k, 0.0):g}" for k in need)
        wants = ", ".join(f"{v:g} {k}" for k, v in short.items())
        parts = [
            f"train.world_size={ranks} ranks" if ranks else "",
            f"rollout.servers={engines} engines" if engines else "",
            f"task.env_workers={env_workers} environment workers" if env_workers else "",
        ]
        parts = [p for p in parts if p]
        what = " and ".join(parts) if len(parts) < 3 else f"{parts[0]}, {parts[1]} and {parts[2]}"
        raise ConfigError(
            f"cluster.ray_address={cfg.cluster.ray_address}: the cluster has {has} in all; {what} need "
            f"{wants} (one CPU each): add nodes or lower them"
        )
    if ranks:  # placed as the train stage will place them, each rank reaches rank 0's rendezvous
        from rl_core.run.cluster import check_rendezvous

        if why := check_rendezvous(ctx):
            raise ConfigError(f"cluster.ray_address={cfg.cluster.ray_address}: {why}")
