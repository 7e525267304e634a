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
    from rl_core.models.model import load_tokenizer, prompt_ids, uses_chat_template
    from rl_core.models.vision import (
        expanded_ids,
        expands_in_processor,
        image_marker,
        image_prefix,
        with_image_marker,
    )

    tok = load_tokenizer(folder)
    chat = ctx.cfg.model.chat_template
    images = isinstance(ctx.env, Multimodal) and ctx.multimodal
    extra = len(image_prefix(folder)) if images and not expands_in_processor(folder) else 0

    def length(task: dict[str, Any], where: str) -> int:
        prompt = ctx.env.reset(task, 0)
        try:
            if images and expands_in_processor(folder):  # the image's tiles: as many tokens as its size makes
                marked = with_image_marker(
                    prompt, uses_chat_template(tok, prompt, chat), image_marker(folder)
                )
                return len(expanded_ids(folder, tok, marked, [ctx.env.image(task)], chat))
            return len(prompt_ids(tok, prompt, chat)) + extra
        except Exception as e:  # noqa: BLE001 - a template raises what it likes (Jinja errors, raise_exception)
            raise ConfigError(
                f"model.path {ctx.cfg.model.path}: the prompt of task.env={ctx.cfg.task.env} {where} cannot "
                f"be rendered for the policy (model.chat_template={chat}): {type(e).__name__}: {e}"
            ) from None

    best, where = 0, ""
    for split, tasks in (("train", ctx.train_tasks), ("heldout", ctx.heldout_tasks)):
        for i, task in enumerate(tasks):
            n = length(task, f"{split} row {i}")
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
    ``model.max_position`` or the folder's ``max_position_embeddings`` (a ``ConfigError``: more prompts an
    iteration than the task has, a text-only folder for an environment that shows images)."""
    cfg = ctx.cfg
    per, have = cfg.rollout.prompts_per_iteration, len(ctx.train_tasks)
    if per > have and not (cfg.task.env == "dataset" and getattr(ctx.env.options, "order", "") == "epochs"):
        raise ConfigError(
            f"rollout.prompts_per_iteration={per} is more than the {have} training prompts of "
            f"task.env={cfg.task.env}: lower it (rollout.n sets the samples per prompt) or raise "
            "task.train_size"
        )
    if not cfg.model.path:
        return
    from rl_core.models.policy_folder import fetch_policy_folder
    from rl_core.models.vision import family

    with tempfile.TemporaryDirectory() as d:
        folder = fetch_policy_folder(cfg.model.path, d, large=False)
        if ctx.multimodal and not family(folder):
            raise ConfigError(
                f"task.env={cfg.task.env} shows images, and model.path {cfg.model.path} is a text-only "
                "policy: give a vision-language folder (Idefics3, SmolVLM, LLaVA, Qwen-VL)"
            )
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


def cluster_needs(cfg: Any, placement: Any) -> tuple[dict[str, int], dict[str, float]]:
    """What the run places on its cluster: how many of each actor (a launched train stage's ranks, the
    rollout engines, the environment workers, the reward model's actor; a CPU each) and the resources they
    take together (GPUs on a GPU machine: a rank's one, an engine's own, the reward model's one)."""
    counts = {
        "ranks": cfg.train.world_size if cfg.train.launched else 0,
        "engines": cfg.rollout.servers if not cfg.rollout.server_urls else 0,
        "env_workers": cfg.task.env_workers if cfg.task.executor == "ray" and not cfg.task.ray_address else 0,
        "reward": 1 if "reward_model" in cfg.reward.weights and not cfg.reward.model.url else 0,
    }
    need = {"CPU": float(sum(counts.values()))}
    gpus = (counts["ranks"] if placement.trainer_gpus else 0) + sum(len(g) for g in placement.server_gpus)
    gpus += counts["reward"] if placement.reward_vllm else 0
    if gpus:
        need["GPU"] = float(gpus)
    return counts, need


def shortfall(cfg: Any, counts: dict[str, int], need: dict[str, float], have: dict[str, float]) -> str:
    """The refusal's line when the cluster ``have`` lacks some of ``need``, naming what it has and who needs
    it; "" when it has enough.

    >>> from types import SimpleNamespace as NS
    >>> cfg = NS(cluster=NS(ray_address="10.0.0.1:6379"), train=NS(world_size=2), rollout=NS(servers=2),
    ...          task=NS(env_workers=2))
    >>> counts = {"ranks": 2, "engines": 2, "env_workers": 0, "reward": 1}
    >>> shortfall(cfg, counts, {"CPU": 5.0}, {"CPU": 4.0})
    "cluster.ray_address=10.0.0.1:6379: the cluster has CPU 4 in all; train.world_size=2 ranks, \
rollout.servers=2 engines and the reward model's actor need 5 CPU (one CPU each): add nodes or lower them"
    >>> shortfall(cfg, counts, {"CPU": 5.0}, {"CPU": 6.0, "GPU": 0.0})
    ''
    """
    short = {k: v for k, v in need.items() if have.get(k, 0.0) < v}
    if not short:
        return ""
    has = ", ".join(f"{k} {have.get(k, 0.0):g}" for k in need)
    wants = ", ".join(f"{v:g} {k}" for k, v in short.items())
    named = {
        "ranks": f"train.world_size={cfg.train.world_size} ranks",
        "engines": f"rollout.servers={cfg.rollout.servers} engines",
        "env_workers": f"task.env_workers={cfg.task.env_workers} environment workers",
        "reward": "the reward model's actor",
    }
    parts = [named[k] for k, n in counts.items() if n]
    what = " and ".join(parts) if len(parts) < 3 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    return (
        f"cluster.ray_address={cfg.cluster.ray_address}: the cluster has {has} in all; {what} need {wants} "
        "(one CPU each): add nodes or lower them"
    )


def check_cluster_resources(ctx: Any) -> None:
    """Refuse (``ConfigError``, one line) a cluster that has fewer CPUs (GPUs on a GPU machine) than the run's
    actors take together (``cluster_needs``), naming what it has (``shortfall``). Then the ranks, placed as
    the train stage places them, must each reach rank 0's rendezvous port. Joined now, before any stage."""
    cfg = ctx.cfg
    counts, need = cluster_needs(cfg, ctx.placement)
    if not cfg.cluster.ray_address or not any(counts.values()):
        return
    import ray

    from rl_core.run.cluster import connect

    connect(cfg.cluster.ray_address, cfg.task.env)
    if why := shortfall(cfg, counts, need, ray.cluster_resources()):
        raise ConfigError(why)
    ranks = counts["ranks"]
    if ranks:  # placed as the train stage will place them, each rank reaches rank 0's rendezvous
        from rl_core.run.cluster import check_rendezvous

        if why := check_rendezvous(ctx):
            raise ConfigError(f"cluster.ray_address={cfg.cluster.ray_address}: {why}")
