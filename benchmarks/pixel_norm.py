"""Whether the built-in Idefics3 policy reads a MiniWoB++ page, by its pixel normalization: SmolVLM's 0.5/0.5
against the environment's own screens' statistics (``rl_core.models.idefics3.screen_statistics``).

    .venv/bin/python benchmarks/pixel_norm.py --json            # 600 training pages, 400 steps an arm
    .venv/bin/python benchmarks/pixel_norm.py --smoke --json    # 10 pages, 2 steps an arm, writes nowhere

Both arms are the built-in policy of ``configs/miniwob.yaml``'s ``model`` section (``write_builtin``, the same
seed: the same weights), differing only in the processor's ``image_mean``/``image_std``. Each is trained
from random init on the DOM oracle's click (``oracle_actions``) for the first screen of ``click-test`` pages
(a button of random size and place), the same batches in the same order, then answers greedily for unseen
pages; its click is played on the page. ``held_out_success`` is the share the page scored as solved,
``distinct_actions`` how many different clicks it gave (1: the same click whatever the page shows). The
policy runs on transformers here (vLLM reads the same processor: ``tests/integration/test_miniwob.py``).

``ratio`` = held-out success with the screens' statistics / with SmolVLM's (the latter floored at one page).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_smoke_flag, finish, installed, result_file  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "pixel_norm.json"
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "miniwob.yaml"
TASK = "click-test"


def _prompt_text(tok: Any, instruction: str) -> str:
    """The rollout's first prompt: the screen, then the instruction, in the chat template."""
    from rl_core.models.vision import image_content

    turns = [{"role": "user", "content": image_content(1, instruction)}]
    return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)


def _examples(folder: Path, pages: list[tuple[str, bytes, str]]) -> list[tuple[list[int], list[int]]]:
    """Each page's (prompt ids with its image expanded, answer ids closed by EOS)."""
    from rl_core.models.vision import encode, processor

    tok = processor(str(folder)).tokenizer
    out = []
    for instruction, shot, action in pages:
        ids, _ = encode(folder, _prompt_text(tok, instruction), [shot], add_special_tokens=False)
        out.append((ids, tok(action, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))
    return out


def train_arm(
    folder: Path, train: list[tuple[str, bytes, str]], steps: int, batch: int, lr: float, seed: int
) -> tuple[Any, float]:
    """The policy of ``folder`` trained on ``train``'s oracle clicks; its final loss (mean of the last 10)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from rl_core.models.vision import vision_inputs

    model = AutoModelForImageTextToText.from_pretrained(folder).float().train()
    examples = _examples(folder, train)
    pixels = vision_inputs(folder, [[shot] for _, shot, _ in train])
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    pad = model.config.text_config.pad_token_id
    losses = []
    for step in range(steps):
        idx = torch.randint(len(examples), (batch,), generator=gen)
        rows = [examples[i] for i in idx.tolist()]
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.full((batch, width), pad)
        labels, attn = torch.full((batch, width), -100), torch.zeros((batch, width), dtype=torch.long)
        for r, (p, a) in enumerate(rows):
            ids[r, : len(p) + len(a)] = torch.tensor(p + a)
            labels[r, len(p) : len(p) + len(a)] = torch.tensor(a)
            attn[r, : len(p) + len(a)] = 1
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / max(1, steps // 10))
        extra = {k: v[idx] for k, v in pixels.items()}
        loss = model(input_ids=ids, attention_mask=attn, labels=labels, **extra).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss))
    return model.eval(), sum(losses[-10:]) / len(losses[-10:])


def held_out(
    model: Any, folder: Path, env: Any, tasks: list[dict], pages: list[tuple[str, bytes, str]]
) -> dict:
    """The greedy click for each unseen page, played on it: success share and distinct clicks."""
    import torch

    from rl_core.models.vision import processor, vision_inputs

    tok = processor(str(folder)).tokenizer
    clicks, solved = [], 0
    for task, (prompt, _), (_, shot, _) in zip(tasks, _examples(folder, pages), pages, strict=True):
        extra = vision_inputs(folder, [[shot]])
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=16,
                do_sample=False,
                eos_token_id=tok.eos_token_id,
                **extra,
            )
        click = tok.decode(out[0, len(prompt) :], skip_special_tokens=True)
        clicks.append(click)
        env.reset(task, 0)
        res = env.step(click)
        solved += bool(res.done and res.outcome["correct"])
    return {
        "held_out_success": solved / len(tasks),
        "distinct_actions": len(set(clicks)),
        "clicks": clicks[:5],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pages", type=int, default=600, help="training pages")
    ap.add_argument("--heldout", type=int, default=100, help="unseen pages")
    ap.add_argument("--steps", type=int, default=400, help="optimizer steps an arm")
    ap.add_argument("--out", type=Path, default=None)
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.pages, args.heldout, args.steps = 10, 10, 2

    import envs.miniwob as mw
    from rl_core.models.idefics3 import SMOLVLM_PIXELS, screen_statistics, write_builtin
    from rl_core.schema.config import load_config
    from rl_core.training.sft import SCREENS

    sets = [
        f"task.env_args.tasks=[{TASK}]",
        f"task.train_size={args.pages}",
        f"task.heldout_size={args.heldout}",
    ]
    cfg = load_config(CONFIG, sets)
    env = mw.MiniWoBEnv(mw.MiniWoBOptions(tasks=[TASK]))
    began = time.perf_counter()
    splits = {s: env.tasks(s, cfg.task, cfg.experiment.seed) for s in ("train", "heldout")}
    pages = {
        s: [
            (*mw._first(TASK, int(t["page_seed"]), env.options.browsers), mw.oracle_actions(env, t)[0])
            for t in ts
        ]
        for s, ts in splits.items()
    }
    pages_s = time.perf_counter() - began
    screens = [shot for _, shot, _ in pages["train"][:SCREENS]]  # what init measures the run's on
    arms: dict[str, Any] = {}
    for name, pixels, shown in (
        ("smolvlm", SMOLVLM_PIXELS, []),
        ("screens", screen_statistics(screens), screens),
    ):
        began = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:  # the same weights; only the processor's normalization
            folder = write_builtin(Path(d), cfg.model, 0, shown)
            model, loss = train_arm(folder, pages["train"], args.steps, 32, cfg.warmup.lr, seed=0)
            got = held_out(model, folder, env, splits["heldout"], pages["heldout"])
        arms[name] = {"pixels": [list(pixels[0]), list(pixels[1])], "final_loss": round(loss, 4), **got}
        arms[name]["seconds"] = round(time.perf_counter() - began, 1)
        print(name, arms[name], flush=True)
    mw.POOL.close()
    floor = 1 / args.heldout
    result = {
        "benchmark": "pixel_norm",
        "task": TASK,
        "pages": args.pages,
        "heldout": args.heldout,
        "steps": args.steps,
        "batch": 32,
        "lr": cfg.warmup.lr,
        "policy": cfg.model.model_dump(
            include={"hidden_size", "num_layers", "vision_hidden_size", "vision_layers"}
        ),
        "pages_s": round(pages_s, 1),
        "arms": arms,
        "versions": {"miniwob": installed("miniwob")},
        "ratio": arms["screens"]["held_out_success"] / max(arms["smolvlm"]["held_out_success"], floor),
        "ratio_definition": "held-out success, screens' statistics / SmolVLM's 0.5/0.5 (floored at one page)",
    }
    finish(result, result_file(args.out, OUT, args.smoke), args.json, args.smoke)


if __name__ == "__main__":
    main()
