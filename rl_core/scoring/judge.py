"""The LLM judge as a reward component: ``reward.weights: {judge: w}`` scores every completion with a judge
model (``reward.judge.model``, e.g. one ``rlfoundry judge train`` wrote) run on a rollout engine of
``rl_core.generation.rollout`` (``reward.judge.engine``: the same vLLM or HF engine generate uses).

Each (prompt, completion) is rendered into ``reward.judge.template`` (``rl_core.scoring.judge_text.render``:
the answer escaped inside its tag), judged once per iteration however often it occurs, and the judge's verdict
parsed (``parse_score``) into a reward in [0, 1]. A verdict with no readable score in range scores 0 and is
counted (``judge_unparsed``), as does an answer whose prompt is longer than the judge's context
(``judge_too_long``): had either abstained, a policy could escape the judge's low scores by padding its answer
past the judge's context or by baiting the judge into an unreadable verdict. Requests are greedy by default
and seeded from the run seed, the iteration and the judged text (``derive_seed``), so a replayed score stage
judges bit for bit alike. The raw verdict is stored per rollout (column ``judge_verdict``).

Consistency, each iteration (``reward.judge.consistency_samples`` each): a sample of answers judged a second
time, in another batch with other seeds (``judge_self_agreement``: share with the same score), and pairs of
answers to one prompt judged in both orders with ``reward.judge.pairwise_template``
(``judge_pairwise_agreement``: share of pairs, among those with two readable verdicts, where both orders pick
the same answer). Cost: ``judge_seconds``, ``judge_prompt_tokens``, ``judge_completion_tokens`` (checks
included), ``judge_judged`` (distinct answers judged).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.base import Outcome
from rl_core.artifacts.seeding import derive_seed
from rl_core.models.model import defused
from rl_core.run.context import RunContext
from rl_core.scoring.judge_text import parse_choice, parse_score, render
from rl_core.scoring.rewards import BatchScores, batch_builtin


@dataclass
class Verdict:
    text: str | None  # None: the rendered prompt did not fit the judge's context
    prompt_tokens: int
    completion_tokens: int


class Judge:
    """A judge model on a rollout engine, with its tokenizer and the ``reward.judge`` settings."""

    def __init__(self, folder: str | Path, settings: Any, rollout_cfg: Any, placement: Any = None):
        """``placement``: the run's (rl_core.models.placement); on a GPU machine the judge's engine goes where
        its ``judge_engine()`` says, else on the CPU at the judge's own context length."""
        from rl_core.generation.rollout import start_engine
        from rl_core.models.model import load_tokenizer

        self.folder = str(folder)
        self.settings = settings
        self.tokenizer = load_tokenizer(folder)
        self.max_len = int(json.loads((Path(folder) / "config.json").read_text())["max_position_embeddings"])
        placed = placement.judge_engine() if placement is not None else None
        self.engine = start_engine(
            settings.engine, folder, rollout_cfg, max_model_len=self.max_len, placement=placed
        )
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def run(self, texts: list[str], seeds: list[int]) -> list[Verdict]:
        """One verdict per rendered prompt, in one engine call."""
        from rl_core.generation.rollout import Request, SamplingSpec
        from rl_core.models.model import prompt_ids

        s = self.settings
        ids = [prompt_ids(self.tokenizer, t) for t in texts]
        fits = [i for i, x in enumerate(ids) if len(x) + s.max_tokens <= self.max_len]
        spec = SamplingSpec(n=1, temperature=s.temperature, top_p=1.0, max_tokens=s.max_tokens)
        wake = getattr(self.engine, "wake", None)
        if wake is not None:  # asleep since the last train stage when colocated with the trainer
            wake()
        outs = self.engine.generate([Request(ids[i], seeds[i]) for i in fits], spec) if fits else []
        got: list[Verdict] = [Verdict(None, 0, 0) for _ in texts]
        for i, out in zip(fits, outs, strict=True):
            got[i] = Verdict(out[0].text, len(ids[i]), len(out[0].token_ids))
            self.prompt_tokens += len(ids[i])
            self.completion_tokens += len(out[0].token_ids)
        return got


def judge_folder(path: str) -> Path:
    """The judge's local folder: ``path`` itself, or a copy of a remote (fsspec) one in the cache."""
    if not path:
        raise ValueError(
            "reward.weights has 'judge' but reward.judge.model is empty: name a judge folder (e.g. one "
            "`rlfoundry judge train --config CONFIG --out DIR` wrote)"
        )
    if "://" not in path:
        if not (Path(path) / "config.json").is_file():
            raise ValueError(f"reward.judge.model {path}: no Hugging Face model folder there")
        return Path(path)
    from rl_core.artifacts.paths import cache_dir
    from rl_core.models.policy_folder import fetch_policy_folder

    dest = cache_dir("judge") / hashlib.sha256(path.encode()).hexdigest()[:16]
    return dest if (dest / "config.json").exists() else fetch_policy_folder(path, dest)


def held_judge(ctx: RunContext) -> Judge:
    """The run's judge (started on first use, held by the context across iterations)."""
    s = ctx.cfg.reward.judge
    held = ctx.held
    if held.judge is None or held.judge.settings != s:
        held.judge = Judge(judge_folder(s.model), s, ctx.cfg.rollout, ctx.placement)
    return held.judge


def _batch_key(pairs: list[tuple[str, str]]) -> str:
    """A digest of the batch's judged texts: what the consistency samples are drawn by (with the run seed)."""
    h = hashlib.sha256()
    for p, c in pairs:
        h.update(f"{len(p)}:{p}{len(c)}:{c}".encode())
    return h.hexdigest()[:16]


def self_agreement(
    judge: Judge, seed: int, sample: list[tuple[str, str]], scores: dict[tuple[str, str], float | None]
) -> float:
    """Share of ``sample`` whose second verdict (reversed order, other seeds) scores as the first did (an
    abstention matching an abstention); NaN for an empty sample."""
    if not sample:
        return float("nan")
    s = judge.settings
    again = list(reversed(sample))
    tok = judge.tokenizer
    texts = [
        render(s.template, prompt=p, completion=defused(tok, c), max_score=s.max_score) for p, c in again
    ]
    verdicts = judge.run(texts, [derive_seed(seed, "judge-again", p, c) for p, c in again])
    same = [_score(v, s.max_score) == scores[k] for k, v in zip(again, verdicts, strict=True)]
    return sum(same) / len(same)


def pairwise_agreement(judge: Judge, seed: int, pairs: list[tuple[str, str, str]]) -> tuple[float, int]:
    """For (prompt, a, b) pairs judged as (a, b) and as (b, a): the share, among pairs with two readable
    verdicts, where both orders pick the same answer (NaN when none), and the count of pairs without."""
    s = judge.settings
    texts, seeds = [], []
    for p, a, b in pairs:
        for first, second in ((a, b), (b, a)):
            texts.append(
                render(
                    s.pairwise_template,
                    prompt=p,
                    first=defused(judge.tokenizer, first),
                    second=defused(judge.tokenizer, second),
                    max_score=s.max_score,
                )
            )
            seeds.append(derive_seed(seed, "judge-pair", p, first, second))
    verdicts = judge.run(texts, seeds)
    agree = readable = 0
    for j in range(len(pairs)):
        ab, ba = (parse_choice(v.text or "") for v in verdicts[2 * j : 2 * j + 2])
        if ab is None or ba is None:
            continue
        readable += 1
        agree += ab != ba  # (a, b) -> 1 and (b, a) -> 2 both pick a
    return (agree / readable if readable else float("nan")), len(pairs) - readable


def _score(v: Verdict, max_score: int) -> float | None:
    return None if v.text is None else parse_score(v.text, max_score)


def _consistency(
    judge: Judge, seed: int, pairs: list[tuple[str, str]], scores: dict[tuple[str, str], float | None]
) -> dict[str, float]:
    k = judge.settings.consistency_samples
    if k == 0:
        return {}
    rng = random.Random(derive_seed(seed, "judge-sample", _batch_key(pairs)))
    sample = rng.sample(pairs, min(k, len(pairs)))
    by_prompt: dict[str, list[str]] = {}
    for p, c in pairs:
        by_prompt.setdefault(p, []).append(c)
    candidates = [(p, cs[i], cs[j]) for p, cs in by_prompt.items() for i in range(len(cs)) for j in range(i)]
    duel = rng.sample(candidates, min(k, len(candidates)))
    pairwise, unreadable = pairwise_agreement(judge, seed, duel)
    return {
        "self_agreement": self_agreement(judge, seed, sample, scores),
        "pairwise_agreement": pairwise,
        "pairwise_unparsed": float(unreadable),
    }


@batch_builtin("judge")
def judge_reward(
    ctx: RunContext, prompts: list[str], completions: list[str], outcomes: list[Outcome], iteration: int
) -> BatchScores:
    """Each completion's judge score in [0, 1] (0 where the verdict has no score or the answer did not fit the
    judge's context: provoking either never pays), with the consistency and cost metrics. A sampling judge
    (``reward.judge.temperature`` > 0) draws anew each iteration: the same answer's lucky verdict is not
    paid at every iteration."""
    start = time.perf_counter()
    seed = derive_seed(ctx.cfg.experiment.seed, "judge-iteration", iteration)
    with ctx.held.judge_lock:  # one user of the judge's engine at a time
        judge = held_judge(ctx)
        s = judge.settings
        judge.prompt_tokens = judge.completion_tokens = 0
        pairs = list(dict.fromkeys(zip(prompts, completions, strict=True)))  # each distinct answer once
        # the answer's special-token text stays text: it cannot close the judge's turn and write its own
        texts = [
            render(s.template, prompt=p, completion=defused(judge.tokenizer, c), max_score=s.max_score)
            for p, c in pairs
        ]
        got = judge.run(texts, [derive_seed(seed, "judge", p, c) for p, c in pairs])
        verdicts = dict(zip(pairs, got, strict=True))
        scores = {k: _score(v, s.max_score) for k, v in verdicts.items()}
        checks = _consistency(judge, seed, pairs, scores)
        tokens = {"prompt_tokens": judge.prompt_tokens, "completion_tokens": judge.completion_tokens}
    rows = [verdicts[k] for k in zip(prompts, completions, strict=True)]
    values = [scores[k] for k in zip(prompts, completions, strict=True)]
    return BatchScores(
        values=[0.0 if x is None else x for x in values],
        metrics={
            "unparsed": float(
                sum(v.text is not None and x is None for v, x in zip(rows, values, strict=True))
            ),
            "too_long": float(sum(v.text is None for v in rows)),
            "judged": float(len(pairs)),
            "seconds": time.perf_counter() - start,
            **{k: float(v) for k, v in tokens.items()},
            **checks,
        },
        columns={"verdict": [v.text if v.text is not None else "" for v in rows]},
    )
