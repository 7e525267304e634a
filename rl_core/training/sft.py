"""Base-model stages: build the tiny model and tokenizer (``init``), then a short supervised warm-up.

With ``model.path`` set, ``init`` checks that folder (``rl_core.models.policy_folder``) and puts it into the
store unchanged instead. The warm-up sees only ``warmup.examples`` training problems for ``warmup.steps``
steps, so the base model answers in the right format with low but non-zero accuracy: RL has room to show what
it adds. ``warmup.steps: 0`` passes the init checkpoint through unchanged (a model of your own may need no
warm-up). Prompts are tokenized as the generate stage does (``rl_core.models.model.prompt_ids``: the chat
template when used)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from envs.base import Corpus, Demonstrations, FlawedTeacher, Multimodal, Teacher, turns
from rl_core.artifacts.report import emit
from rl_core.artifacts.seeding import derive_seed
from rl_core.artifacts.stage import StageJob, StageResult
from rl_core.models.model import (
    build_model,
    build_tokenizer,
    folder_dtype,
    load_model,
    load_tokenizer,
    pad_id,
    prompt_ids,
    save_checkpoint,
    save_with_weights,
    stored_weights,
)
from rl_core.models.vision import (
    IMAGE_TOKEN,
    build_vlm,
    expands_in_processor,
    image_prefix,
    model_inputs,
    pixel_values,
    save_processor,
)
from rl_core.run.context import RunContext


def init_body(ctx: RunContext, job: StageJob) -> StageResult:
    cfg = ctx.cfg
    if cfg.model.path:
        return _init_from_folder(ctx, job)
    if ctx.multimodal == "idefics3":  # the environment's screens come in every turn
        return _init_idefics3(ctx, job)
    if isinstance(ctx.env, Corpus):  # environments with their own vocabulary (tool calls, observations)
        texts = ctx.env.corpus(ctx.train_tasks)
    else:
        texts = [t["prompt"] for t in ctx.train_tasks] + [t["answer"] for t in ctx.train_tasks]
    multimodal = isinstance(ctx.env, Multimodal)
    tok = build_tokenizer(texts, cfg.model.vocab_size, [IMAGE_TOKEN] if multimodal else [])
    seed = derive_seed(cfg.experiment.seed, 0, "init")
    if multimodal:
        model = build_vlm(cfg.model, tok, seed, ctx.env.image_size)
    else:
        model = build_model(cfg.model, tok, seed)
    with tempfile.TemporaryDirectory() as d:
        save_checkpoint(model, tok, d)
        if multimodal:
            save_processor(d, tok, ctx.env.image_size, cfg.model.patch_size)
        ref = ctx.store.put_dir(d, f"{job.out_uri}/checkpoint")
    params = sum(p.numel() for p in model.parameters())
    return StageResult(
        outputs={"checkpoint": ref},
        metrics={"parameters": params, "vocab_size": len(tok), **data_metrics(ctx)},
        seeds={"init": seed},
    )


# how many training tasks' first screens the built-in Idefics3 policy's pixel normalization is measured on
SCREENS = 64


def _init_idefics3(ctx: RunContext, job: StageJob) -> StageResult:
    """The built-in Idefics3 policy (``rl_core.models.idefics3``): a folder as a user's SmolVLM would be, its
    pixels normalized by the first screens of the first ``SCREENS`` training tasks."""
    from rl_core.models.idefics3 import write_builtin
    from rl_core.models.policy_folder import check_policy_folder

    seed = derive_seed(ctx.cfg.experiment.seed, 0, "init")
    screens = [ctx.env.image(t) for t in ctx.train_tasks[:SCREENS]]
    with tempfile.TemporaryDirectory() as d:
        folder = write_builtin(Path(d), ctx.cfg.model, seed, screens)
        vllm = ctx.placement.rollout_engine == "vllm"  # checked as a user's folder is
        info = check_policy_folder(str(folder), max_model_len=ctx.cfg.model.max_position, vllm=vllm)
        ref = ctx.store.put_dir(folder, f"{job.out_uri}/checkpoint")
    return StageResult(
        outputs={"checkpoint": ref},
        metrics={
            "parameters": info["parameters"],
            "vocab_size": info["vocab_size"],
            "pixel_screens": len(screens),
            **data_metrics(ctx),
        },
        seeds={"init": seed},
    )


def data_metrics(ctx: RunContext) -> dict[str, Any]:
    """The data files the tasks were read from, with their sha256 (a dataset environment), for the base's
    init manifest."""
    from envs.base import DataFiles

    return {"data_sha256": ctx.env.data_files()} if isinstance(ctx.env, DataFiles) else {}


def _init_from_folder(ctx: RunContext, job: StageJob) -> StageResult:
    """The user's policy folder, checked, into the store byte for byte as the base checkpoint."""
    from rl_core.models.policy_folder import check_model_section, fetch_policy_folder

    info = check_model_section(ctx.cfg, ctx.placement.rollout_engine)
    assert info is not None
    with tempfile.TemporaryDirectory() as d:
        local = fetch_policy_folder(ctx.cfg.model.path, d)
        ref = ctx.store.put_dir(local, f"{job.out_uri}/checkpoint")
    return StageResult(
        outputs={"checkpoint": ref},
        metrics={"parameters": info["parameters"], "vocab_size": info["vocab_size"], **data_metrics(ctx)},
        seeds={"init": f"model.path {ctx.cfg.model.path} ({info['architecture']})"},
    )


def _pad(
    seqs: list[list[int]], labs: list[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 where no loss)."""
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), pad_id)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (x, lab) in enumerate(zip(seqs, labs, strict=True)):
        ids[i, : len(x)] = torch.tensor(x)
        attn[i, : len(x)] = 1
        labels[i, : len(x)] = torch.tensor(lab)
    return ids, attn, labels


def _sft_batch(
    tok: Any,
    env: Any,
    tasks: list[dict[str, Any]],
    flawed: list[bool] | None = None,
    prefix: list[int] | None = None,
    chat_template: bool | str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt (after ``prefix``, e.g. image placeholders) + answer + EOS; labels on the answer only. A flawed
    demonstration is the environment's teacher mistake (``FlawedTeacher``)."""
    seqs, labs = [], []
    for i, t in enumerate(tasks):
        p = (prefix or []) + prompt_ids(tok, t["prompt"], chat_template)
        bad = bool(flawed and flawed[i])
        if bad and not isinstance(env, FlawedTeacher):
            raise ValueError(
                f"warmup.teacher_error_rate > 0 but environment {env.name!r} has no flawed teacher "
                "(a flawed(task) method): set warmup.teacher_error_rate=0"
            )
        ans = env.flawed(t) if bad else t.get("solution", t["answer"])  # a dataset's worked solution
        a = tok(ans, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append(p + a)
        labs.append([-100] * len(p) + a)
    return _pad(seqs, labs, pad_id(tok))


def _segment_batch(
    tok: Any, env: Any, tasks: list[dict[str, Any]], flawed: list[bool]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Multi-turn demonstrations: model turns (each closed by EOS) carry labels, prompt and observations
    don't, exactly as the RL stage masks them."""
    seqs, labs = [], []
    for t, bad in zip(tasks, flawed, strict=True):
        ids: list[int] = []
        lab: list[int] = []
        for text, is_model in env.demonstration(t, bad):
            piece = tok(text, add_special_tokens=False)["input_ids"] + (
                [tok.eos_token_id] if is_model else []
            )
            ids += piece
            lab += piece if is_model else [-100] * len(piece)
        seqs.append(ids)
        labs.append(lab)
    return _pad(seqs, labs, pad_id(tok))


def first_turns(mask: list[int], k: int) -> list[int]:
    """The loss mask of an episode's first ``k`` model turns (runs of 1s) only: a teacher's episode that did
    not end with its actions (a flawed one) goes on to ``max_turns`` with empty turns, which teach nothing.

    >>> first_turns([1, 1, 0, 0, 1, 0, 1, 1], 2)
    [1, 1, 0, 0, 1, 0, 0, 0]
    """
    out, runs, prev = [], 0, 0
    for m in mask:
        runs += int(bool(m) and not prev)
        out.append(int(bool(m) and runs <= k))
        prev = m
    return out


def _teacher_batch(
    ctx: RunContext,
    tok: Any,
    ckpt: Any,
    src: Any,
    tasks: list[dict],
    flawed: list[bool],
    played: dict[tuple[str, bool], tuple] | None = None,
) -> tuple:
    """The teacher's episodes (``envs.base.Teacher``) played through the generation's own turns by a scripted
    engine: the token stream, images and loss mask an RL episode with those actions has; labels on the
    teacher's actions (each closed by EOS; not on the empty turns an episode its actions did not end goes on
    with), the vision tensors of every image each episode showed. ``played``
    keeps each (task, flawed) episode once played (an episode is a function of both: a warm-up of many steps
    plays each of its examples once, not once a step)."""
    from rl_core.artifacts.images import row_images
    from rl_core.generation.episodes import sample_table
    from rl_core.generation.rollout import SamplingSpec
    from rl_core.generation.turns import Scripted
    from rl_core.models.vision import vision_inputs

    played = {} if played is None else played
    keys = [(str(t["key"]), bool(bad)) for t, bad in zip(tasks, flawed, strict=True)]
    todo = {k: (t, bad) for k, t, bad in zip(keys, tasks, flawed, strict=True) if k not in played}
    if todo:
        new_tasks = [t for t, _ in todo.values()]
        seeds = list(range(len(new_tasks)))  # the scripted engine knows each episode by its seed
        scripts = [ctx.env.teacher_actions(t, bad) for t, bad in todo.values()]
        spec = SamplingSpec(n=1, temperature=1.0, max_tokens=ctx.cfg.rollout.max_tokens)
        engine = Scripted(tok, scripts, turns(ctx.env))
        table = sample_table(ctx, ckpt, new_tasks, spec, seeds, engine=engine)
        run_uri = ctx.store.run_uri(ctx.run_id)
        for k, r, acts in zip(todo, table.itertuples(), scripts, strict=True):
            prompt, done = list(r.prompt_ids), list(r.completion_ids)
            taught = first_turns(list(r.loss_mask), len(acts))
            labels = [-100] * len(prompt) + [t if m else -100 for t, m in zip(done, taught, strict=True)]
            if "images" in table.columns:
                images = row_images(ctx.store, run_uri, r.images)
            elif "image" in table.columns:
                images = (bytes(r.image),)
            else:
                images = None
            played[k] = (prompt + done, labels, images)
    rows = [played[k] for k in keys]
    extra: dict[str, Any] = {}
    if rows and rows[0][2] is not None:
        extra = vision_inputs(src, [r[2] for r in rows])
    return (*_pad([r[0] for r in rows], [r[1] for r in rows], pad_id(tok)), extra)


def _warmup_batch(
    ctx: RunContext,
    tok: Any,
    src: Any,
    chosen: list[dict],
    flawed: list[bool],
    ckpt: Any = None,
    played: dict[tuple[str, bool], tuple] | None = None,
) -> tuple:
    """One warm-up batch of ``chosen`` tasks: input ids, attention mask, labels and the model's extra inputs
    (a multimodal task's pixel values). ``played``: a teacher's episodes so far (``_teacher_batch``)."""
    if isinstance(ctx.env, Teacher):
        return _teacher_batch(ctx, tok, ckpt, src, chosen, flawed, played)
    if isinstance(ctx.env, Demonstrations):
        return (*_segment_batch(tok, ctx.env, chosen, flawed), {})
    if isinstance(ctx.env, Multimodal):
        batch = _sft_batch(tok, ctx.env, chosen, flawed, image_prefix(src), ctx.cfg.model.chat_template)
        return (*batch, {"pixel_values": pixel_values(src, [ctx.env.image(t) for t in chosen])})
    return (*_sft_batch(tok, ctx.env, chosen, flawed, None, ctx.cfg.model.chat_template), {})


def warmup_body(ctx: RunContext, job: StageJob) -> StageResult:
    cfg = ctx.cfg.warmup
    if cfg.steps == 0:  # no warm-up: the init checkpoint itself is the base policy
        return StageResult(outputs={"checkpoint": job.inputs["checkpoint"]}, metrics={"steps": 0})
    src = ctx.local_checkpoint(job.inputs["checkpoint"])
    tok = load_tokenizer(src)
    model = load_model(src, ctx.placement.workloads["warmup"]).train()
    dev = next(model.parameters()).device
    seed = derive_seed(ctx.cfg.experiment.seed, 0, "warmup")
    gen = torch.Generator().manual_seed(seed)
    pool = ctx.train_tasks[: cfg.examples]
    multimodal = isinstance(ctx.env, Multimodal)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    losses = []
    played: dict[tuple[str, bool], tuple] = {}
    every = max(1, cfg.steps // 10)
    for step in range(cfg.steps):
        idx = torch.randint(len(pool), (cfg.batch_size,), generator=gen).tolist()
        flawed = (torch.rand(cfg.batch_size, generator=gen) < cfg.teacher_error_rate).tolist()
        chosen = [pool[i] for i in idx]
        ids, attn, labels, extra = _warmup_batch(
            ctx, tok, src, chosen, flawed, job.inputs["checkpoint"], played
        )
        lr = cfg.lr * min(1.0, (step + 1) / max(1, cfg.steps // 10))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, attn = ids.to(dev), attn.to(dev)
        extra = model_inputs(model, ids, attn, {k: v.to(dev) for k, v in extra.items()})
        loss = model(input_ids=ids, attention_mask=attn, labels=labels.to(dev), **extra).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss))
        if (step + 1) % every == 0 or step + 1 == cfg.steps:  # minutes on a CPU: say how far it is
            loss_now = sum(losses[-every:]) / len(losses[-every:])
            emit({"kind": "status", "text": f"warm-up step {step + 1}/{cfg.steps}: loss {loss_now:.3f}"})
    with tempfile.TemporaryDirectory() as d:
        if ctx.cfg.model.path or expands_in_processor(src):  # the folder as it was, with the new weights
            weights = stored_weights(model.state_dict(), folder_dtype(src))  # a bf16 folder stays bf16
            save_with_weights(src, weights, d, ctx.cfg.model.max_shard_bytes)
        else:
            save_checkpoint(model, tok, d)
            if multimodal:
                save_processor(d, tok, ctx.env.image_size, ctx.cfg.model.patch_size)
        ref = ctx.store.put_dir(d, f"{job.out_uri}/checkpoint")
    tail = losses[-10:] or [float("nan")]
    return StageResult(
        outputs={"checkpoint": ref},
        metrics={"final_loss": sum(tail) / len(tail), "steps": cfg.steps, "examples": len(pool)},
        seeds={"warmup": seed},
    )
