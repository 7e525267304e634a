"""The reward model: a tiny transformer with a scalar head (``Qwen2ForSequenceClassification``, one label),
trained here on preference pairs that rlfoundry draws from its own tasks, saved as a Hugging Face folder
that vLLM's pooling runner serves (``infra/reward_server.py``) and the score stage calls
(``rl_core/scoring/reward_client.py``).

Pairs: for each task of a split, the prompt with the task's answer (chosen) against the prompt with a wrong
answer (rejected): a near miss (the answer plus a small nonzero offset, when it is a number) and another
task's answer, each checked wrong by the environment itself. The loss is Bradley-Terry's,
``-log sigmoid(r(chosen) - r(rejected))``; the held-out pairs (the held-out tasks) give the pairwise accuracy.
The tokenizer is the policy's (trained on the task text exactly as the init stage trains it), the model has
the policy's sizes (``model``), and every seed is derived from ``experiment.seed``: the same config writes the
same bytes.

    metrics = train_reward_model(load_config("configs/smoke.yaml"), "/tmp/rm")   # or:
    rlfoundry reward-model train --config configs/smoke.yaml --out /tmp/rm
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_core.artifacts.seeding import derive_seed

SCORE_TEXT = "{prompt}{completion}"  # what the reward model reads: the prompt text, then the completion


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str


def score_text(prompt: str, completion: str) -> str:
    """The text a completion is scored on.

    >>> score_text("2+3=", "5")
    '2+3=5'
    """
    return SCORE_TEXT.format(prompt=prompt, completion=completion)


def _is_wrong(env_name: str, env_args: dict[str, Any], task: dict[str, Any], answer: str) -> bool:
    from envs.base import make_env

    env = make_env(env_name, env_args)
    env.reset(task, 0)
    return not env.step(answer).outcome.get("correct", False)


def _near_miss(answer: str, rng: random.Random) -> str | None:
    try:
        value = int(answer)
    except ValueError:
        return None
    return str(value + rng.choice([-1, 1]) * rng.randint(1, 9))


def preference_pairs(
    env_name: str, env_args: dict[str, Any], tasks: list[dict[str, Any]], seed: int
) -> list[Pair]:
    """Two pairs per task (a near miss, another task's answer), in task order; each rejected answer is one
    the environment scores wrong. Deterministic in ``seed``."""
    if not tasks or any("answer" not in t or not isinstance(t.get("prompt"), str) for t in tasks):
        raise ValueError(
            f"reward model: task.env {env_name!r} has no text prompts with reference answers to build "
            "preference pairs from"
        )
    rng = random.Random(seed)
    out: list[Pair] = []
    for i, task in enumerate(tasks):
        other = (
            tasks[(i + 1 + rng.randrange(len(tasks) - 1)) % len(tasks)]["answer"] if len(tasks) > 1 else ""
        )
        for wrong in (_near_miss(task["answer"], rng), other):
            if wrong and _is_wrong(env_name, env_args, task, wrong):
                out.append(Pair(task["prompt"], task["answer"], wrong))
    return out


def reward_folder_problem(path: str | Path) -> str:
    """What keeps ``path`` from being a reward model folder (a config with one label, weights, a
    tokenizer), or "" when nothing does."""
    folder = Path(path)
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (folder / f).exists()]
    if not folder.is_dir() or missing:
        what = "is not a folder" if not folder.is_dir() else f"has no {', '.join(missing)}"
        return f"{folder} {what} (a reward model folder: rlfoundry reward-model train)"
    labels = json.loads((folder / "config.json").read_text()).get("id2label", {})
    if len(labels) != 1:
        return f"{folder} is not a one-label (scalar) model: {len(labels)} labels"
    return ""


def policy_tokenizer(cfg: Any, train_tasks: list[dict[str, Any]], env: Any) -> Any:
    """The policy's tokenizer, trained on the task text as the init stage trains it."""
    from envs.base import Corpus, Multimodal
    from rl_core.models.model import build_tokenizer

    if isinstance(env, Multimodal):
        raise ValueError("reward model: multimodal tasks are not supported (text only)")
    if isinstance(env, Corpus):
        texts = env.corpus(train_tasks)
    else:
        texts = [t["prompt"] for t in train_tasks] + [t["answer"] for t in train_tasks]
    return build_tokenizer(texts, cfg.model.vocab_size)


def build_reward_model(model_cfg: Any, tokenizer: Any, seed: int) -> Any:
    """A randomly initialised ``Qwen2ForSequenceClassification`` with one label (a raw scalar score), fp32,
    the policy's sizes; deterministic in ``seed``."""
    import torch
    from transformers import Qwen2ForSequenceClassification

    from rl_core.models.model import text_config

    config = text_config(model_cfg, tokenizer)
    config.num_labels = 1
    config.architectures = ["Qwen2ForSequenceClassification"]
    config.problem_type = "regression"  # one raw score; never a softmax over one label
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
    return model.float()


def encode(tokenizer: Any, texts: list[str], max_len: int) -> list[list[int]]:
    """Token ids of each text as the server receives them: no special tokens added, and none made from the
    text (a special token's text in it, ``<|im_end|>`` or the pad token's, stays characters: the policy writes
    the completion, and a pad id inside a sequence moved the HF head's pooling off its last token); a text
    longer than ``max_len`` keeps its first and its last ``max_len // 2`` tokens (the question and the
    answer's end), so a long answer cannot push the question out of what the reward model sees.

    >>> class Chars:  # a tokenizer of one id per character
    ...     def __call__(self, texts, add_special_tokens, split_special_tokens):
    ...         return {"input_ids": [[ord(c) for c in t] for t in texts]}
    >>> ["".join(map(chr, ids)) for ids in encode(Chars(), ["Q?abcdefghA", "Q?A"], 6)]
    ['Q?aghA', 'Q?A']
    """
    head = max_len // 2
    out = []
    for ids in tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]:
        out.append(
            list(ids) if len(ids) <= max_len else list(ids[:head]) + list(ids[len(ids) - (max_len - head) :])
        )
    return out


def rewards(model: Any, ids: list[list[int]], pad_id: int) -> Any:
    """The model's scalar score of each sequence (right padding: positions start at 0, as in vLLM)."""
    import torch

    width = max(len(x) for x in ids)
    batch = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        batch[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    dev = next(model.parameters()).device
    return model(input_ids=batch.to(dev), attention_mask=mask.to(dev)).logits[:, 0]


def pairwise_accuracy(model: Any, tokenizer: Any, pairs: list[Pair], max_len: int, chunk: int = 256) -> float:
    """The share of pairs whose chosen text scores above its rejected one."""
    import torch

    right = 0
    with torch.no_grad():
        for s in range(0, len(pairs), chunk):
            part = pairs[s : s + chunk]
            texts = [score_text(p.prompt, c) for p in part for c in (p.chosen, p.rejected)]
            r = rewards(model, encode(tokenizer, texts, max_len), tokenizer.pad_token_id)
            right += int((r[0::2] > r[1::2]).sum())
    return right / max(len(pairs), 1)


def _pairs(cfg: Any, env: Any, split: str) -> list[Pair]:
    """The pairs of a split's tasks: ``reward.model.train_tasks`` problems (at least ``task.train_size``) for
    training, at least 256 held-out ones (the split is by a hash of the problem: still disjoint)."""
    want = (
        max(cfg.reward.model.train_tasks, cfg.task.train_size) if split == "train" else cfg.task.heldout_size
    )
    sizes = cfg.task.model_copy(update={"train_size": want, "heldout_size": max(256, want)})
    tasks = env.tasks(split, sizes, cfg.experiment.seed)
    seed = derive_seed(cfg.experiment.seed, 0, f"reward_model_pairs_{split}")
    return preference_pairs(cfg.task.env, cfg.task.env_args, tasks, seed)


def train_reward_model(cfg: Any, out_dir: str | Path) -> dict[str, float]:
    """Build, train (``reward.model.train_steps`` steps of ``train_batch`` pairs, AdamW at ``lr``) and save
    the reward model of ``cfg``'s task to ``out_dir``; returns its metrics (held-out pairwise accuracy
    first), also written to ``out_dir/reward_model.json``."""
    import numpy as np
    import torch

    from envs.base import make_env
    from rl_core.models.model import save_checkpoint

    rm, env = cfg.reward.model, make_env(cfg.task.env, cfg.task.env_args)
    train_tasks = env.tasks("train", cfg.task, cfg.experiment.seed)
    tok = policy_tokenizer(cfg, train_tasks, env)
    train, heldout = _pairs(cfg, env, "train"), _pairs(cfg, env, "heldout")
    model = build_reward_model(cfg.model, tok, derive_seed(cfg.experiment.seed, 0, "reward_model_init"))
    from rl_core.models.placement import Machine, plan

    model.to(plan(cfg, Machine.this()).workloads["reward_model"].device)  # a no-op on the CPU
    max_len = cfg.model.max_position
    order = np.random.default_rng(derive_seed(cfg.experiment.seed, 0, "reward_model_batches"))
    opt = torch.optim.AdamW(model.parameters(), lr=rm.lr, weight_decay=0.0)
    start, loss = time.perf_counter(), torch.tensor(0.0)
    model.train()
    for _ in range(rm.train_steps):
        picked = [train[int(i)] for i in order.integers(0, len(train), size=rm.train_batch)]
        texts = [score_text(p.prompt, c) for p in picked for c in (p.chosen, p.rejected)]
        r = rewards(model, encode(tok, texts, max_len), tok.pad_token_id)
        loss = -torch.nn.functional.logsigmoid(r[0::2] - r[1::2]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    metrics = {
        "heldout_pairwise_accuracy": pairwise_accuracy(model, tok, heldout, max_len),
        "train_pairwise_accuracy": pairwise_accuracy(model, tok, train[:512], max_len),
        "final_loss": float(loss.detach()),
        "train_pairs": float(len(train)),
        "heldout_pairs": float(len(heldout)),
        "train_s": time.perf_counter() - start,
    }
    tok.padding_side = "right"
    out = save_checkpoint(model, tok, out_dir)
    (out / "reward_model.json").write_text(json.dumps({"task": cfg.task.env, **metrics}, indent=1))
    return metrics
