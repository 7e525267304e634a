"""Your own dataset as the environment (``task.env: dataset``): a file of prompts with ground truth and a
verifier — GSM8K/MATH-style JSONL or Parquet, verl's ``prompt`` + ``reward_model.ground_truth`` layout, a
``datasets`` ``save_to_disk`` folder; local or any fsspec URL (``s3://``).

    task:
      env: dataset
      env_args:
        train: data/train.jsonl            # .jsonl / .json (or JSON Lines) / .parquet, save_to_disk folder
        heldout: data/test.jsonl           # or heldout_fraction: 0.1 (rows split by a hash of the prompt)
        prompt_field: problem              # a text, or chat messages [{role, content}, ...], the user's last
        answer_field: answer               # dotted for nested fields: reward_model.ground_truth
        solution_field: solution           # optional: what the warm-up imitates (else the answer)
        verifier: math                     # math (math-verify), numeric, exact, code
        tests_field: test_list             # verifier code: the row's tests (asserts, or check(candidate))

Single-turn. The verifier sees what follows the completion's reasoning block (the text after the last
``</think>``; a completion whose ``<think>`` never closes is not well formed); the whole completion is what is
trained. ``math`` parses both sides with math-verify (LaTeX, ``\\boxed{}``, fractions, equivalent forms);
``numeric`` compares numbers (commas, fractions, relative tolerance 1e-6; a row whose answer is not one
number is refused at load, an answer's expression is no number); ``exact`` the
stripped texts; ``code`` runs the completion's code against the row's tests in the sandbox (HumanEval's
hardened harness, ``envs/humaneval.py``: a fresh sandbox run each, the function called through a proxy, a
one-time nonce): correct only if every test passes. The user's own reward functions see the same outcome as
usual.

Every training prompt is used once per epoch (``order: epochs``, the default): iteration k draws positions
``[(k-1)P, kP)`` of a sequence of seeded permutations, one per epoch, so the order is a function of the seed
and the iteration alone — the same across a crash and resume, and under asynchronous RL. The files' sha256 are
part of the base model's identity (``rl_core.run.context.base_id``) and recorded with the run (``run.json``):
a file changed since the run started is refused on resume, naming it. A bad file — unreadable, a row without
its field, an empty split, a held-out row that is also a training row — fails when the config is loaded,
naming the file, the row (and a JSON Lines file's line) and the field. The answer is compared as written
(``envs/dataset_rows.py``): a number in plain notation (a float64 column's ``18.0`` is ``18``), never in its
Python spelling (a boolean or a list is refused)."""

from __future__ import annotations

import functools
import hashlib
import json
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from envs.base import StepResult, derived_seed
from envs.dataset_rows import answer as _answer
from envs.dataset_rows import field as _field
from envs.dataset_rows import file_rows
from envs.dataset_rows import prompt as _prompt
from envs.dataset_verify import check, code_outcomes, code_tests, final_answer
from envs.numerals import gold_number


class DatasetOptions(BaseModel):
    """The dataset environment's options (``task.env_args``)."""

    model_config = ConfigDict(extra="forbid")

    train: str = Field(description="Training rows: a .jsonl/.json/.parquet file or a save_to_disk folder.")
    heldout: str = Field("", description="Held-out rows (same formats); or set heldout_fraction.")
    heldout_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="Without a held-out file: this share of train (by a prompt hash)."
    )
    prompt_field: str = Field("prompt", description="The prompt: a text or chat messages (dotted path).")
    answer_field: str = Field("answer", description="The ground truth the verifier compares with.")
    solution_field: str = Field("", description="A worked solution the warm-up imitates (else the answer).")
    verifier: Literal["math", "numeric", "exact", "code"] = Field(
        "math", description="How an answer is checked (code: the row's tests run in the sandbox)."
    )
    tests_field: str = Field(
        "",
        description="verifier code: the row's tests — a list of assert lines (MBPP's test_list), or source "
        "defining check(candidate) (HumanEval's test).",
    )
    entry_field: str = Field(
        "",
        description="verifier code: the row's field naming the function under test (HumanEval's "
        "entry_point); else the function the first assert calls.",
    )
    order: Literal["epochs", "sample"] = Field(
        "epochs", description="epochs: every training prompt once per epoch; sample: drawn each iteration."
    )

    @field_validator("train", "heldout")
    @classmethod
    def _absolute(cls, v: str) -> str:
        """A local file is recorded as an absolute path, as ``model.path`` is: ``show``, ``resume`` or a
        replay may run from another directory. URLs (``s3://``) as given."""
        return v if not v or "://" in v else str(Path(v).expanduser().resolve())

    @model_validator(mode="after")
    def _splits(self) -> DatasetOptions:
        if bool(self.heldout) == (self.heldout_fraction > 0):
            raise ValueError("task.env_args: set exactly one of heldout (a file) and heldout_fraction")
        if (self.verifier == "code") != bool(self.tests_field) or (self.entry_field and not self.tests_field):
            raise ValueError(
                "task.env_args: tests_field (and entry_field) go with verifier: code, and it needs them"
            )
        load_splits(self)  # a bad file fails here, when the config is loaded
        return self


# -- reading ---------------------------------------------------------------------------------------------
def _open(uri: str) -> tuple[Any, str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path


def _digest(uri: str) -> str:
    """sha256 of a file, or of a folder's files (sorted relative names and contents); computed once per
    version of the data (its files' sizes and modification times), not on every config load."""
    fs, path = _open(uri)
    if not fs.exists(path):
        raise ValueError(f"task.env_args: {uri}: no such file or folder")
    files = sorted(fs.find(path)) if fs.isdir(path) else [path]
    stamp = tuple(
        (f, (i := fs.info(f)).get("size"), str(i.get("mtime") or i.get("LastModified") or i.get("ETag")))
        for f in files
    )
    return _digest_of(uri, stamp)


@functools.lru_cache(maxsize=32)
def _digest_of(uri: str, stamp: tuple[Any, ...]) -> str:
    fs, path = _open(uri)
    h = hashlib.sha256()
    if fs.isdir(path):
        for f in sorted(fs.find(path)):
            h.update(f[len(path) :].encode() + b"\0" + fs.cat_file(f))
        return h.hexdigest()
    return hashlib.sha256(fs.cat_file(path)).hexdigest()


def _rows(uri: str) -> list[tuple[Any, str]]:
    """(row, where it is: a JSON Lines file's line, a folder's file) of one file or folder."""
    fs, path = _open(uri)
    if not fs.exists(path):
        raise ValueError(f"task.env_args: {uri}: no such file or folder")
    if fs.isdir(path):  # a save_to_disk folder (its .arrow shards), or a folder of .parquet / .jsonl files
        every = sorted(fs.find(path))
        files = next(
            (
                fs_
                for ext in (".arrow", ".parquet", ".jsonl")
                if (fs_ := [f for f in every if f.endswith(ext)])
            ),
            [],
        )
        if not files:
            raise ValueError(f"task.env_args: {uri}: a folder without .arrow, .parquet or .jsonl files")
        rels = [f[len(path) :].lstrip("/") for f in files]
        return [
            (row, f"{rel} {line}".strip())
            for f, rel in zip(files, rels, strict=True)
            for row, line in _file_rows(fs, f, f"{uri}/{rel}")
        ]
    return _file_rows(fs, path, uri)


def _file_rows(fs: Any, path: str, name: str) -> list[tuple[Any, str]]:
    """(row, where in the file it is: "line 5" of a JSON Lines file, else "") of one file."""
    return [(row, f"line {n}" if n else "") for row, n in file_rows(fs.cat_file(path), path, name)]


def _key(prompt: str | list[dict[str, str]]) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def _same(prompt: str | list[dict[str, str]]) -> str:
    """The prompt as the split check compares it: whitespace collapsed and stripped, case-folded (in each
    message of a chat prompt).

    >>> _same("What is  5 plus 6?\\n") == _same(" what is 5 plus 6?")
    True
    """
    if isinstance(prompt, str):
        return " ".join(prompt.split()).casefold()
    return _key([{k: _same(v) if isinstance(v, str) else v for k, v in m.items()} for m in prompt])


def _tasks(opts: DatasetOptions, uri: str, split: str) -> list[dict[str, Any]]:
    out = []
    for i, (row, line) in enumerate(_rows(uri)):
        try:
            out.append(_task(opts, uri, split, i, row))
        except ValueError as e:
            if not line:
                raise
            raise ValueError(f"{e} ({line})") from None  # row i of the rows is line n of the file
    if not out:
        raise ValueError(f"task.env_args: {uri}: the {split} split has no rows")
    return out


def _task(opts: DatasetOptions, uri: str, split: str, i: int, row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError(f"task.env_args: {uri}: row {i} is not an object")
    task: dict[str, Any] = {
        "task_id": f"{split}-{i:06d}",
        "prompt": _prompt(_field(row, opts.prompt_field, uri, i), uri, i, opts.prompt_field),
        "answer": _answer(
            _field(row, opts.answer_field, uri, i),
            f"task.env_args: {uri}: row {i} field {opts.answer_field!r}",
        ),
        "row": i,
    }
    if not task["answer"]:
        raise ValueError(f"task.env_args: {uri}: row {i} field {opts.answer_field!r} is empty")
    if opts.verifier == "numeric" and gold_number(task["answer"]) is None:
        raise ValueError(
            f"task.env_args: {uri}: row {i} field {opts.answer_field!r} is {task['answer'][:80]!r}, not one "
            "number (verifier numeric: a number, units after it at most; use verifier math for expressions)"
        )
    if opts.solution_field:
        value = _field(row, opts.solution_field, uri, i)
        # a text as it is (a code solution's indentation is its meaning); a number written as answers are
        where = f"task.env_args: {uri}: row {i} field {opts.solution_field!r}"
        task["solution"] = value if isinstance(value, str) else _answer(value, where)
    if opts.verifier == "code":
        entry = str(_field(row, opts.entry_field, uri, i)) if opts.entry_field else None
        task["test"], task["entry"] = code_tests(_field(row, opts.tests_field, uri, i), entry, uri, i)
    return task


@functools.lru_cache(maxsize=8)
def _splits_of(opts_json: str, digests: tuple[str, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    opts = DatasetOptions.model_construct(**json.loads(opts_json))
    train = _tasks(opts, opts.train, "train")
    if opts.heldout:
        heldout = _tasks(opts, opts.heldout, "heldout")
        seen = {_same(t["prompt"]): t["row"] for t in train}
        first: dict[str, int] = {}
        for t in heldout:  # compared up to whitespace and case (a trailing newline is the same problem)
            key, row = _same(t["prompt"]), t["row"]
            if key in seen:
                raise ValueError(
                    f"task.env_args: {opts.heldout}: row {row} is also row {seen[key]} of {opts.train} "
                    "(held-out rows must not be trained on)"
                )
            if key in first:
                raise ValueError(
                    f"task.env_args: {opts.heldout}: row {row} is also its row {first[key]} "
                    "(a held-out problem is scored once)"
                )
            first[key] = row
    else:  # by a hash of the prompt: stable whatever the file's order, disjoint by construction
        cut = opts.heldout_fraction * 2**32
        held = [int(hashlib.sha256(_key(t["prompt"]).encode()).hexdigest()[:8], 16) < cut for t in train]
        heldout = [{**t, "task_id": f"heldout-{t['row']:06d}"} for t, h in zip(train, held, strict=True) if h]
        # the hash is of the prompt as written (splits stay where they were); a row that is a held-out one up
        # to whitespace and case is not trained on, and a held-out problem is scored once
        firsts: dict[str, dict[str, Any]] = {}
        for t in heldout:
            firsts.setdefault(_same(t["prompt"]), t)
        heldout, kept = list(firsts.values()), set(firsts)
        train = [t for t, h in zip(train, held, strict=True) if not h and _same(t["prompt"]) not in kept]
        if not train or not heldout:
            raise ValueError(
                f"task.env_args: heldout_fraction={opts.heldout_fraction} of {opts.train} leaves a split "
                "empty"
            )
    return train, heldout


def data_files(opts: DatasetOptions) -> dict[str, str]:
    """{file or folder: sha256} of the data the options name."""
    return {uri: _reading(uri, _digest, uri) for uri in (opts.train, opts.heldout) if uri}


def load_splits(opts: DatasetOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) tasks of the options' files (read once per content)."""
    digests = tuple(data_files(opts).values())
    where = " and ".join(u for u in (opts.train, opts.heldout) if u)
    return _reading(where, _splits_of, opts.model_dump_json(), digests)


def _reading(where: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, with any failure to reach the data (an unreachable S3 endpoint, denied credentials, a
    network error: whatever the fsspec backend raises) a ``ValueError`` naming the file."""
    try:
        return fn(*args)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001  (botocore's and aiohttp's errors are not OSErrors)
        raise ValueError(f"task.env_args: {where}: cannot be read ({type(e).__name__}: {e})") from None


# -- the environment -------------------------------------------------------------------------------------
def epoch_order(n_tasks: int, per_iteration: int, iteration: int, seed: int) -> list[int]:
    """The training-task indexes of ``iteration`` (1-based): positions ``[(k-1)P, kP)`` of one seeded
    permutation of all tasks per epoch.

    >>> sorted(epoch_order(6, 3, 1, 0) + epoch_order(6, 3, 2, 0)) == list(range(6))
    True
    """
    out = []
    for pos in range((iteration - 1) * per_iteration, iteration * per_iteration):
        epoch, j = divmod(pos, n_tasks)
        perm = list(range(n_tasks))
        random.Random(derived_seed(seed, epoch, "epoch-order")).shuffle(perm)
        out.append(perm[j])
    return out


class DatasetEnv:
    name = "dataset"
    config_model: type[BaseModel] = DatasetOptions
    path_options = ("train", "heldout")  # files it reads: the Prefect form's policy holds them to its roots

    def __init__(self, options: BaseModel | None = None) -> None:
        if options is None:
            raise ValueError("task.env=dataset needs task.env_args with at least train and a held-out split")
        assert isinstance(options, DatasetOptions)
        self.options = options
        self.order = options.order
        self._task: dict[str, Any] | None = None

    def tasks(self, split: str, task_cfg: Any, seed: int) -> list[dict[str, Any]]:
        """Every row of the split, in file order, up to ``task.train_size`` / ``task.heldout_size``."""
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        train, heldout = load_splits(self.options)
        rows, cap = (train, task_cfg.train_size) if split == "train" else (heldout, task_cfg.heldout_size)
        return rows[:cap]

    def data_files(self) -> dict[str, str]:
        return data_files(self.options)

    def corpus(self, tasks: list[dict[str, Any]]) -> list[str]:
        out = []
        for t in tasks:
            p = t["prompt"]
            out += [p] if isinstance(p, str) else [m["content"] for m in p]
            out += [t["answer"], t.get("solution", "")]
        return [x for x in out if x]

    def reset(self, task: dict[str, Any], seed: int) -> str | list[dict[str, str]]:
        self._task = task
        return task["prompt"]

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        return self.step_many([(self._task, action)])[0]

    def step_many(self, episodes: list[tuple[dict[str, Any], str]]) -> list[StepResult]:
        """Single-turn episodes (task, completion) verified in order; ``code`` runs the batch's programs in
        one sandbox pool map."""
        texts = [final_answer(action) for _, action in episodes]
        answered = [(task, text) for (task, _), text in zip(episodes, texts, strict=True) if text is not None]
        if self.options.verifier == "code":
            verdicts = iter(code_outcomes(answered))
        else:
            checked = (check(self.options.verifier, task["answer"], text) for task, text in answered)
            verdicts = ({**v._asdict(), "hedge": v.hedge or ""} for v in checked)
        out = []
        for text in texts:
            unclosed = text is None  # a <think> that never closed: nothing to verify
            blank = {"correct": False, "well_formed": False, "parsed": "", "hedge": ""}
            outcome = blank if unclosed else next(verdicts)
            outcome["unclosed_reasoning"] = unclosed
            out.append(StepResult(observation=None, done=True, outcome=outcome))
        return out
