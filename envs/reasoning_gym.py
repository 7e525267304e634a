"""reasoning-gym's procedural tasks as environments (``task.env: reasoning_gym``): any of its 100+ datasets,
its own generator options and its own scorer.

    task:
      env: reasoning_gym
      env_args:
        dataset: basic_arithmetic          # a reasoning_gym.factory name
        config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}   # the generator's options
        prompt: plain                      # plain: the question as the prompt; chat: one user message

Train and held-out come from the generator with seeds derived from the run's (``derive_seed(seed, split)``),
``task.train_size`` / ``task.heldout_size`` items each. Two items are the same problem when their questions
match once whitespace, brackets and double minus signs are ignored and case-folded, and their gold answers
match (``item_key``: the generator writes one expression several ways); a repeated held-out problem is drawn
again (too few distinct ones is an error naming them), and a training item that is a held-out problem is
dropped (more drawn in its place), so nothing held out is trained on. The verifier is the dataset's own
``score_answer`` on the text after the completion's reasoning block (``envs.dataset_verify.final_answer``),
stripped, or the last ``<answer>...</answer>`` in it (reasoning-gym's own convention,
``reasoning_gym.utils.extract_answer``): ``correct`` when it scores 1, its score kept as ``score`` (partial
credit for the user's reward functions: the dataset's own, and some pay an answer that merely contains the
gold one, e.g. "8 or 99" for 8; the built-in rewards read ``correct``). Some of its scorers evaluate the
answer (``eval``, sympy's ``parse_expr``): an answer that would run more than arithmetic that way, or compute
a number too large, is never given to the scorer (``envs.inert.hazard``); it scores 0, not well formed, and
``refused`` says why; so does an answer the scorer raises on (``scorer_raised: ValueError``:
prime_factorization's on prose, boxnet's on nested lists), deterministically. The warm-up imitates the
generator's answers.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from envs.base import StepResult, derived_seed
from envs.dataset_verify import final_answer
from envs.inert import hazard


def item_key(item: dict[str, Any]) -> tuple[str, str]:
    """What makes two generated items the same problem: the question without whitespace or brackets,
    each run of minus signs cut to its parity (two negations cancel), case-folded; and the gold answer. The
    generator writes one expression several ways (``Calculate -1 - -9.``, ``Calculate ( -1 - -9 ).``,
    ``-( -( 9 * 6 ) )`` for ``9 * 6``); the answer keeps apart the questions this merges that brackets do
    change (``-( 2 - 3 )`` and ``-2 - 3``). Conservative for the split: a training item that merely
    resembles a held-out one is dropped, which costs nothing.

    >>> item_key({"question": "Calculate ( -1 - -9 ).", "answer": 8}) == item_key(
    ...     {"question": "calculate -1 - -9.", "answer": "8"})
    True
    >>> item_key({"question": "Calculate -( -( 9 * 6 ) ).", "answer": 54})
    ('calculate9*6.', '54')
    """
    text = re.sub(r"[\s()\[\]{}]", "", str(item["question"]))
    return re.sub("--", "", text).casefold(), str(item["answer"])


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


class ReasoningGymOptions(BaseModel):
    """The reasoning_gym environment's options (``task.env_args``)."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(description="A reasoning_gym dataset name (reasoning_gym.factory.DATASETS).")
    config: dict[str, Any] = Field({}, description="The generator's own options, passed to it as they are.")
    prompt: Literal["plain", "chat"] = Field(
        "plain", description="The question as text, or as a user message."
    )

    @field_validator("dataset")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in dataset_names():
            close = [n for n in dataset_names() if name.split("_")[0] in n][:8]
            raise ValueError(
                f"unknown reasoning_gym dataset {name!r} (e.g. {', '.join(close or dataset_names()[:8])})"
            )
        return name

    def model_post_init(self, _: Any) -> None:
        _generator(self.dataset, json.dumps(self.config, sort_keys=True), 1, 0)  # bad options fail at load


@functools.lru_cache(maxsize=16)
def _generator(name: str, config_json: str, size: int, seed: int) -> Any:
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **json.loads(config_json))
    except (TypeError, ValueError, AssertionError) as e:
        raise ValueError(f"task.env_args.config for reasoning_gym dataset {name!r}: {e}") from None


class ReasoningGymEnv:
    name = "reasoning_gym"
    config_model: type[BaseModel] = ReasoningGymOptions

    def __init__(self, options: BaseModel | None = None) -> None:
        if options is None:
            raise ValueError(
                "task.env=reasoning_gym needs task.env_args.dataset (a reasoning_gym dataset name)"
            )
        assert isinstance(options, ReasoningGymOptions)
        self.options = options
        self._task: dict[str, Any] | None = None

    def _items(self, split: str, size: int, seed: int) -> list[dict[str, Any]]:
        o = self.options
        split_seed = derived_seed(seed, split, o.dataset)
        ds = _generator(o.dataset, json.dumps(o.config, sort_keys=True), size, split_seed)
        return [ds[i] for i in range(size)]

    def _heldout(self, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        """``task.heldout_size`` held-out items, no two with the same ``item_key`` (drawing more when the
        generator repeats itself)."""
        want = task_cfg.heldout_size
        for factor in (1, 2, 4, 8):
            seen: set[tuple[str, str]] = set()
            items = []
            for x in self._items("heldout", want * factor, seed):
                if item_key(x) not in seen:
                    seen.add(item_key(x))
                    items.append(x)
            if len(items) >= want:
                return items[:want]
        raise ValueError(
            f"reasoning_gym {self.options.dataset}: only {len(items)} distinct held-out questions among "
            f"{want * 8} drawn; lower task.heldout_size or widen its config"
        )

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        if split == "heldout":
            items = self._heldout(task_cfg, seed)
        else:  # task.train_size items that are no held-out item (drawing more when some are)
            held = {item_key(x) for x in self._heldout(task_cfg, seed)}
            want, items = task_cfg.train_size, []
            for factor in (1, 2, 4, 8):
                items = [x for x in self._items(split, want * factor, seed) if item_key(x) not in held][:want]
                if len(items) == want:
                    break
            if len(items) < want:
                raise ValueError(
                    f"reasoning_gym {self.options.dataset}: only {len(items)} training items that are not "
                    f"held-out questions among {want * 8} drawn; lower task.train_size or widen its config"
                )
        out = []
        for i, x in enumerate(items):
            q = x["question"]
            prompt: Any = q if self.options.prompt == "plain" else [{"role": "user", "content": q}]
            out.append({"task_id": f"{split}-{i}", "prompt": prompt, "answer": str(x["answer"]), "entry": x})
        return out

    def corpus(self, tasks: list[dict[str, Any]]) -> list[str]:
        return [t["entry"]["question"] for t in tasks] + [t["answer"] for t in tasks]

    def reset(self, task: dict[str, Any], seed: int) -> str | list[dict[str, str]]:
        self._task = task
        return task["prompt"]

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        text = final_answer(action)
        if (
            text is not None
        ):  # reasoning-gym's own convention, where the model follows it: <answer>...</answer>
            from reasoning_gym.utils import extract_answer

            text = extract_answer(text) or text
        if text is None or not text.strip():
            outcome = {"correct": False, "well_formed": False, "score": 0.0, "refused": ""}
        elif (why := hazard(text.strip())) is not None:  # some scorers evaluate the answer: never code
            outcome = {"correct": False, "well_formed": False, "score": 0.0, "refused": why}
        else:
            o = self.options
            scorer = _generator(o.dataset, json.dumps(o.config, sort_keys=True), 1, 0)
            try:  # some scorers raise on an ordinary malformed answer: the answer's fault, scored 0
                score = float(scorer.score_answer(text.strip(), self._task["entry"]))
            except Exception as e:
                why = f"scorer_raised: {type(e).__name__}"
                outcome = {"correct": False, "well_formed": False, "score": 0.0, "refused": why}
            else:
                outcome = {"correct": score >= 1.0, "well_formed": True, "score": score, "refused": ""}
        return StepResult(observation=None, done=True, outcome=outcome)
