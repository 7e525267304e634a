"""The dataset environment (envs/dataset.py): the file formats users bring (JSONL, JSON, Parquet, a `datasets`
save_to_disk folder, verl's nested layout), the verifiers (math-verify's equivalences, numeric, exact; the
answer read after the reasoning block), one permutation per epoch, and bad input named by file, row and
field before any work. A whole run on a dataset: tests/integration/test_dataset_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from envs.base import make_env
from envs.dataset import DatasetEnv, check, epoch_order, final_answer
from rl_core.artifacts.store import Store
from rl_core.run.context import RunContext, base_id
from rl_core.run.runs import RunError, create_or_resume
from rl_core.schema.config import ConfigError, load_config

ROWS = [
    {"problem": f"What is {i} + {i}?", "answer": str(2 * i), "solution": f"{i}+{i}={2 * i}"}
    for i in range(40)
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(tmp_path: Path, **args):
    if "train" not in args:
        args["train"] = str(_jsonl(tmp_path / "train.jsonl", ROWS[:30]))
    if "heldout_fraction" not in args and "heldout" not in args:
        args["heldout"] = str(_jsonl(tmp_path / "test.jsonl", ROWS[30:]))
    args.setdefault("prompt_field", "problem")
    overrides = ["task.env=dataset", f"task.env_args={json.dumps(args)}", "task.heldout_size=10"]
    return load_config(None, overrides)


def _env(cfg) -> DatasetEnv:
    env = make_env(cfg.task.env, cfg.task.env_args)
    assert isinstance(env, DatasetEnv)
    return env


def test_jsonl_rows_become_tasks_in_file_order(tmp_path):
    cfg = _cfg(tmp_path, solution_field="solution")
    env = _env(cfg)
    train, held = env.tasks("train", cfg.task, 0), env.tasks("heldout", cfg.task, 0)
    assert [t["prompt"] for t in train] == [r["problem"] for r in ROWS[:30]]
    assert [t["answer"] for t in held] == [r["answer"] for r in ROWS[30:]]
    assert train[3]["solution"] == "3+3=6" and len({t["task_id"] for t in train + held}) == 40
    assert env.reset(train[5], 0) == "What is 5 + 5?" and env.step("10").outcome["correct"]


@pytest.mark.parametrize("fmt", ["parquet", "json", "save_to_disk"])
def test_other_formats_read_the_same_rows(tmp_path, fmt):
    if fmt == "parquet":
        src = tmp_path / "train.parquet"
        pd.DataFrame(ROWS[:30]).to_parquet(src)
    elif fmt == "json":
        src = tmp_path / "train.json"
        src.write_text(json.dumps(ROWS[:30]))
    else:
        import datasets

        src = tmp_path / "train_ds"
        datasets.Dataset.from_list(ROWS[:30]).save_to_disk(str(src))
    cfg = _cfg(tmp_path, train=str(src))
    assert [t["answer"] for t in _env(cfg).tasks("train", cfg.task, 0)] == [r["answer"] for r in ROWS[:30]]


def test_verl_layout_chat_messages_and_nested_answers(tmp_path):
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Reason, then box."},
                {"role": "user", "content": f"{i}*3?"},
            ],
            "reward_model": {"style": "rule", "ground_truth": str(3 * i)},
        }
        for i in range(20)
    ]
    src = tmp_path / "verl.parquet"
    pd.DataFrame(rows).to_parquet(src)
    cfg = _cfg(
        tmp_path,
        train=str(src),
        prompt_field="prompt",
        answer_field="reward_model.ground_truth",
        heldout_fraction=0.3,
    )
    env = _env(cfg)
    train, held = env.tasks("train", cfg.task, 0), env.tasks("heldout", cfg.task, 0)
    assert train[0]["prompt"][0] == {"role": "system", "content": "Reason, then box."}
    assert len(train) + len(held) == 20 and held  # split by a hash of the prompt: disjoint, stable
    assert not {json.dumps(t["prompt"]) for t in train} & {json.dumps(t["prompt"]) for t in held}
    assert [t["task_id"] for t in env.tasks("heldout", cfg.task, 0)] == [t["task_id"] for t in held]


@pytest.mark.parametrize(
    "verifier,answer,completion,correct,formed",
    [
        ("math", "\\frac{1}{2}", "so the answer is \\boxed{0.5}", True, True),
        ("math", "0.5", "The answer is $\\frac{2}{4}$.", True, True),
        ("math", "x^2+2x+1", "\\boxed{(x+1)^2}", True, True),
        ("math", "\\frac{1}{2}", "\\boxed{\\frac{1}{3}}", False, True),
        ("math", "7", "I do not know", False, False),
        ("numeric", "1234", "... so in total 1,234 apples", True, True),
        ("numeric", "0.75", "3/4", True, True),
        ("numeric", "12", "maybe 13", False, True),
        ("exact", "Paris", "  Paris ", True, True),
        ("exact", "Paris", "paris", False, True),
    ],
)
def test_verifiers(verifier, answer, completion, correct, formed):
    ok, well, _, _ = check(verifier, answer, completion)
    assert (ok, well) == (correct, formed)


def test_the_verifier_reads_what_follows_the_reasoning(tmp_path):
    env = _env(_cfg(tmp_path, verifier="math"))
    env.reset({"prompt": "2+2?", "answer": "4"}, 0)
    assert env.step("<think>maybe 5? no, 2+2 is 4</think> \\boxed{4}").outcome["correct"]
    assert not env.step("<think>the answer is 4</think> \\boxed{5}").outcome["correct"]  # the think block's 4
    unclosed = env.step("<think>4 4 4 4").outcome
    assert not unclosed["well_formed"] and unclosed["unclosed_reasoning"]
    assert final_answer("no reasoning: 4") == "no reasoning: 4"


def test_each_epoch_is_one_permutation_of_the_training_prompts():
    n, per = 10, 4
    drawn = [i for k in range(1, 11) for i in epoch_order(n, per, k, seed=3)]  # 4 epochs
    epochs = [drawn[e * n : (e + 1) * n] for e in range(4)]
    assert all(sorted(e) == list(range(n)) for e in epochs)
    assert epochs[0] != epochs[1]  # a new order each epoch
    assert epoch_order(n, per, 7, seed=3) == epoch_order(n, per, 7, seed=3)  # a function of (seed, k)
    assert epoch_order(n, per, 1, seed=3) != epoch_order(n, per, 1, seed=4)


@pytest.mark.parametrize(
    "rows,args,message",
    [
        ([{"problem": "1+1?"}], {}, r"train\.jsonl: row 0 has no field 'answer'"),
        ([{"problem": "1+1?", "answer": ""}], {}, r"train\.jsonl: row 0 field 'answer' is empty"),
        ([{"problem": 17, "answer": "1"}], {}, r"row 0 field 'problem' is neither a text nor chat messages"),
        ([], {}, r"train\.jsonl: the train split has no rows"),
        (None, {}, r"train\.jsonl: line 2 is not JSON"),
        ([{"problem": "What is 30 + 30?", "answer": "60"}], {}, r"test\.jsonl: row 0 is also row 0 of"),
        (ROWS[:5], {"verifier": "sympy"}, r"verifier"),
        (ROWS[:5], {"heldout_fraction": 0.2}, r"exactly one of heldout"),
        (ROWS[:5], {"train": "/nonexistent/train.jsonl"}, r"/nonexistent/train\.jsonl: no such file"),
        ([{"problem": "1+1?", "answer": {"x": 1}}], {}, r"row 0 field 'answer' is a dict, not a text"),
        ([{"problem": "1+1?", "answer": float("nan")}], {}, r"row 0 field 'answer' is nan, not a number"),
        ([{"problem": [{"role": "banana", "content": "1+1?"}], "answer": "2"}], {}, r"row 0 .*roles among"),
        ([{"problem": [{"role": "assistant", "content": "1+1?"}], "answer": "2"}], {}, r"need a user turn"),
        ([{"problem": [{"role": "user", "content": " "}], "answer": "2"}], {}, r"row 0 .*empty content"),
        ([{"problem": "1+1?\ud800", "answer": "2"}], {}, r"row 0 field 'problem': not valid Unicode"),
        (
            [{"problem": "1+1?", "answer": None}],
            {},
            r"train\.jsonl: row 0 field 'answer' is null",
        ),  # "no field"
        ([{"problem": "1+1?", "x": {"y": None}}], {"answer_field": "x.y"}, r"row 0 field 'x\.y' is null"),
        ('{"problem": "1+1?", "answer": "2", "id": ' + "9" * 5000 + "}", {}, r"line 1 cannot be read"),
        (
            '{"problem": "1+1?", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}",
            {},
            r"line 1 cannot be read",
        ),
    ],
)
def test_bad_data_is_named_by_file_row_and_field(tmp_path, rows, args, message):
    src = tmp_path / "train.jsonl"
    if rows is None:
        src.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    elif isinstance(rows, str):  # a line json.dumps will not write: past Python's digit or nesting limits
        src.write_text(rows + "\n")
    else:
        _jsonl(src, rows)
    args = {"train": str(src), **args}
    if "heldout_fraction" in args:
        args["heldout"] = str(_jsonl(tmp_path / "test.jsonl", ROWS[30:]))
    with pytest.raises(ConfigError, match=message):
        _cfg(tmp_path, **args)


def test_a_changed_file_is_another_base_and_is_refused_on_resume(tmp_path):
    cfg = _cfg(tmp_path)
    store = Store(str(tmp_path / "store"))
    assert create_or_resume(RunContext(cfg, "d1", store), "new") == "created"
    record = store.read_json(f"{store.root}/d1/run.json")
    assert set(record["data"]) == {cfg.task.env_args["train"], cfg.task.env_args["heldout"]}
    before = base_id(cfg)
    _jsonl(Path(cfg.task.env_args["train"]), [*ROWS[:29], {"problem": "What is 99 + 1?", "answer": "100"}])
    assert base_id(cfg) != before  # the rows are part of the base model's identity
    with pytest.raises(RunError, match=r"data file .*train\.jsonl changed since the run started"):
        create_or_resume(RunContext(cfg, "d1", store), "resume")


# -- verifier: code ---------------------------------------------------------------------------------------
CODE_ROWS = [
    {
        "text": f"Write add_{i}(a, b) returning a + b + {i}.",
        "code": f"def add_{i}(a, b):\n    return a + b + {i}\n",
        "test_list": [f"assert add_{i}(1, 2) == {3 + i}", f"assert add_{i}(0, 0) == {i}"],
    }
    for i in range(6)
]


def _code_cfg(tmp_path: Path, rows=CODE_ROWS, **more):
    args = {
        "train": str(_jsonl(tmp_path / "code_train.jsonl", rows[:4])),
        "heldout": str(_jsonl(tmp_path / "code_test.jsonl", rows[4:])),
        "prompt_field": "text",
        "answer_field": "code",
        "verifier": "code",
        "tests_field": "test_list",
        **more,
    }
    overrides = ["task.env=dataset", f"task.env_args={json.dumps(args)}", "task.heldout_size=10"]
    return load_config(None, overrides)


def test_code_rows_run_their_tests_in_the_sandbox(tmp_path):
    cfg = _code_cfg(tmp_path)
    env = _env(cfg)
    task = env.tasks("train", cfg.task, 0)[1]  # add_1
    assert task["entry"] == "add_1" and task["test"].startswith("def check(candidate):")
    answers = {
        "right": "def add_1(a, b):\n    return a + b + 1\n",
        "fenced": "<think>sum</think>Here:\n```python\ndef add_1(a, b):\n    return 1 + a + b\n```\n",
        "wrong": "def add_1(a, b):\n    return a + b\n",
        "syntax": "def add_1(a, b) return",
        "exits_early": "import sys\nsys.exit(0)\n",  # leaves before any test ran: not a pass
        "always_equal": (  # an object equal to anything: the proxy hands back only plain literals
            "class A:\n    def __eq__(self, o):\n        return True\ndef add_1(a, b):\n    return A()\n"
        ),
        "reasoning_open": "<think>def add_1(a, b): return a + b + 1",
    }
    got = dict(zip(answers, env.step_many([(task, a) for a in answers.values()]), strict=True))
    correct = {k: r.outcome["correct"] for k, r in got.items()}
    assert correct == {
        "right": True,
        "fenced": True,
        "wrong": False,
        "syntax": False,
        "exits_early": False,
        "always_equal": False,
        "reasoning_open": False,
    }
    assert got["syntax"].outcome["well_formed"] is False and got["wrong"].outcome["well_formed"] is True
    assert all(r.outcome["infra_error"] is None for k, r in got.items() if k != "reasoning_open")
    env.reset(task, 0)
    assert env.step(answers["right"]).outcome["correct"] is True  # one at a time: the same verdict


def test_code_rows_in_humaneval_form(tmp_path):
    rows = [
        {
            "prompt": f'def twice_{i}(x):\n    """Twice x."""\n',
            "canonical_solution": "    return 2 * x\n",
            "test": "def check(candidate):\n    assert candidate(3) == 6\n    assert candidate(-1) == -2\n",
            "entry_point": f"twice_{i}",
        }
        for i in range(6)
    ]
    cfg = _code_cfg(
        tmp_path,
        rows,
        prompt_field="prompt",
        answer_field="canonical_solution",
        tests_field="test",
        entry_field="entry_point",
    )
    env = _env(cfg)
    task = env.tasks("train", cfg.task, 0)[0]
    # the completion continues the prompt's signature, as HumanEval's do
    right, wrong = env.step_many([(task, "    return x + x\n"), (task, "    return x\n")])
    assert right.outcome["correct"] is True and wrong.outcome["correct"] is False


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"tests_field": ""}, "tests_field"),
        ({"verifier": "math"}, "tests_field"),  # tests without the code verifier
        ({"tests_field": "nope"}, "row 0 has no field 'nope'"),
        ({"tests_field": "text"}, "neither assert lines nor check"),
    ],
)
def test_bad_code_options_and_rows_are_refused_at_load(tmp_path, change, says):
    with pytest.raises(ConfigError, match=says):
        _code_cfg(tmp_path, **change)


def test_local_data_files_are_recorded_as_absolute_paths(tmp_path, monkeypatch):
    """As model.path is: `show`, `resume` or a replay from another directory still finds the files."""
    (tmp_path / "data").mkdir()
    _jsonl(tmp_path / "data" / "train.jsonl", ROWS[:30])
    _jsonl(tmp_path / "data" / "test.jsonl", ROWS[30:])
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(tmp_path, train="data/train.jsonl", heldout="./data/../data/test.jsonl")
    assert cfg.task.env_args["train"] == str(tmp_path / "data" / "train.jsonl")
    assert cfg.task.env_args["heldout"] == str(tmp_path / "data" / "test.jsonl")
    monkeypatch.chdir("/")
    again = load_config(None, ["task.env=dataset", f"task.env_args={json.dumps(cfg.task.env_args)}"])
    assert len(_env(again).tasks("train", again.task, 0)) == 30


def test_data_that_cannot_be_reached_is_named(tmp_path, monkeypatch):
    """What the fsspec backend raises when the data is out of reach (botocore's EndpointConnectionError for an
    S3 endpoint nothing answers on, denied credentials: not OSErrors) is a config error naming the file."""
    import envs.dataset as dataset

    class Unreachable(Exception):
        pass

    class FS:
        def exists(self, path):
            raise Unreachable(
                'Could not connect to the endpoint URL: "http://127.0.0.1:9/bucket/train.jsonl"'
            )

    monkeypatch.setattr(dataset, "_open", lambda uri: (FS(), uri))
    with pytest.raises(
        ConfigError, match=r"s3://bucket/train\.jsonl: cannot be read \(Unreachable: Could not"
    ):
        _cfg(tmp_path, train="s3://bucket/train.jsonl", heldout_fraction=0.1)


def test_chat_prompt_ending_with_the_assistant_turn_is_refused(tmp_path):
    """An SFT `messages` column ends with the assistant's answer: as a prompt it would show the policy the
    gold answer and open a second assistant turn. Refused, naming the file, row, line and field."""
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3+4?"}]
    sft = [{"messages": [*chat, {"role": "assistant", "content": "7"}], "answer": "7"}]
    with pytest.raises(
        ConfigError,
        match=r"train\.jsonl: row 1 field 'messages': the last chat message is the assistant's, not the "
        r"user's .*\(line 2\)",
    ):
        src = _jsonl(tmp_path / "train.jsonl", [{"messages": chat, "answer": "7"}, *sft])
        held = _jsonl(tmp_path / "held.jsonl", [{"messages": [chat[1]], "answer": "2"}])
        _cfg(tmp_path, train=str(src), heldout=str(held), prompt_field="messages")
    turns = [*chat, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "And 4+4?"}]
    rows = [{"messages": turns, "answer": "8"}]  # earlier assistant turns are fine: the user's is the last
    cfg = _cfg(
        tmp_path,
        train=str(_jsonl(tmp_path / "multi.jsonl", rows)),
        heldout=str(held),
        prompt_field="messages",
    )
    assert _env(cfg).tasks("train", cfg.task, 0)[0]["prompt"] == turns


def test_numeric_answers_are_compared_as_written_not_in_python_spelling(tmp_path):
    """A float64 Parquet column (pandas makes one of an int column with a missing value) holds 18.0 for 18:
    compared as "18", so `exact` pays a right "18"; JSON's 1e20 is 100000000000000000000, not "1e+20"."""
    src = tmp_path / "train.parquet"
    pd.DataFrame({"problem": ["9+9?", "2+5?", "3/2?"], "answer": [18.0, 7.0, 1.5]}).to_parquet(src)
    cfg = _cfg(tmp_path, train=str(src), verifier="exact")
    env = _env(cfg)
    train = env.tasks("train", cfg.task, 0)
    assert [t["answer"] for t in train] == ["18", "7", "1.5"]
    env.reset(train[0], 0)
    assert env.step("18").outcome["correct"] and not env.step("18.5").outcome["correct"]
    rows = [
        {"problem": "10^20?", "answer": 1e20},
        {"problem": "1/10^7?", "answer": 1e-07},
        {"problem": "0.1+0.2 in floats?", "answer": 0.1 + 0.2},
        {"problem": "-0?", "answer": -0.0},
        {"problem": "2^70?", "answer": 2**70},
        {"problem": "as text", "answer": " 18.0 "},
    ]
    cfg = _cfg(tmp_path, train=str(_jsonl(tmp_path / "nums.jsonl", rows)))
    got = [t["answer"] for t in _env(cfg).tasks("train", cfg.task, 0)]
    assert got == ["100000000000000000000", "0.0000001", "0.30000000000000004", "0", str(2**70), "18.0"]
    assert check("numeric", got[0], "100000000000000000000").correct
    assert check("math", got[0], "\\boxed{100000000000000000000}").correct


@pytest.mark.parametrize(
    "value,message",
    [
        (True, r"row 1 field 'answer' is a boolean \(True\), not a text or a number"),
        (["Paris"], r"row 1 field 'answer' is a list, not a text or a number"),
        (["0.5", "\\frac{1}{2}"], r"row 1 field 'answer' is a list, not a text or a number"),
        (float("inf"), r"row 1 field 'answer' is inf, not a number"),
    ],
)
def test_answers_without_one_text_form_are_refused(tmp_path, value, message):
    src = _jsonl(tmp_path / "train.jsonl", [ROWS[0], {"problem": "Q?", "answer": value}])
    with pytest.raises(ConfigError, match=rf"train\.jsonl: {message}.*\(line 2\)"):
        _cfg(tmp_path, train=str(src))


def test_json_lines_are_read_as_the_writers_write_them(tmp_path):
    """A byte-order mark; U+2028 and NEL inside a string (json.dumps(ensure_ascii=False) writes them raw: not
    line breaks); CRLF line ends; a .json holding JSON Lines (datasets' to_json); errors name the line."""
    rows = [
        {"problem": "Line one\u2028What is 5+5?", "answer": "10"},
        {"problem": "caf\u00e9 \x85 7+1?", "answer": 8},
    ]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows)
    src = tmp_path / "train.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + text.encode())
    cfg = _cfg(tmp_path, train=str(src))
    got = _env(cfg).tasks("train", cfg.task, 0)
    assert [(t["prompt"], t["answer"]) for t in got] == [(r["problem"], str(r["answer"])) for r in rows]
    import datasets

    datasets.Dataset.from_list(ROWS[:30]).to_json(str(tmp_path / "hf.json"))
    cfg = _cfg(tmp_path, train=str(tmp_path / "hf.json"))
    assert [t["answer"] for t in _env(cfg).tasks("train", cfg.task, 0)] == [r["answer"] for r in ROWS[:30]]
    gaps = tmp_path / "gaps.jsonl"
    gaps.write_text("\n" + json.dumps(ROWS[0]) + "\n\n\n" + json.dumps({"problem": "x?"}) + "\n")
    with pytest.raises(ConfigError, match=r"gaps\.jsonl: row 1 has no field 'answer' \(line 5\)"):
        _cfg(tmp_path, train=str(gaps))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"bad\.json: line 3 is not JSON"):
        _cfg(tmp_path, train=str(bad))


def test_a_literal_dotted_column_name_is_found(tmp_path):
    """datasets' Dataset.flatten() names a column `reward_model.ground_truth`: found as it is, before the
    dotted path is read as nested keys (which still works: test_verl_layout_chat_messages_and_nested_answers);
    where both are there, the literal key wins."""
    import datasets

    nested = [
        {"prompt": f"{i}+1?", "reward_model": {"ground_truth": str(i + 1), "style": "r"}} for i in range(20)
    ]
    src = tmp_path / "flat.parquet"
    datasets.Dataset.from_list(nested).flatten().to_parquet(str(src))
    args = {"train": str(src), "prompt_field": "prompt", "heldout_fraction": 0.3}
    cfg = _cfg(tmp_path, answer_field="reward_model.ground_truth", **args)
    env = _env(cfg)
    tasks = env.tasks("train", cfg.task, 0) + env.tasks("heldout", cfg.task, 0)
    assert sorted(int(t["answer"]) for t in tasks) == list(range(1, 21))
    both = [{"prompt": f"{i}?", "a.b": f"literal{i}", "a": {"b": f"nested{i}"}} for i in range(20)]
    args["train"] = str(_jsonl(tmp_path / "both.jsonl", both))
    cfg = _cfg(tmp_path, answer_field="a.b", **args)
    assert all(t["answer"].startswith("literal") for t in _env(cfg).tasks("train", cfg.task, 0))


def test_a_json_file_of_one_row_is_read_as_that_row():
    """``Dataset.to_json`` of a single row writes one object: a JSON Lines file of one line, not a list."""
    from envs.dataset_rows import file_rows

    row = {"problem": "1+1?", "answer": "2"}
    assert file_rows((json.dumps(row) + "\n").encode(), "one.json", "one.json") == [(row, 1)]
    with pytest.raises(ValueError, match="one.json: expected a JSON list of rows, or JSON Lines"):
        file_rows(b'"just text"', "one.json", "one.json")


def test_a_numeric_solution_is_written_as_its_answer_is(tmp_path):
    """The warm-up imitates the solution: a float64 column's ``18.0`` taught ``18.0`` while the verifier pays
    the answer's ``18``."""
    rows = [{"problem": f"What is {i} + {i}?", "answer": 2 * i, "solution": float(2 * i)} for i in range(40)]
    cfg = _cfg(
        tmp_path,
        train=str(_jsonl(tmp_path / "tr.jsonl", rows[:30])),
        heldout=str(_jsonl(tmp_path / "te.jsonl", rows[30:])),
        solution_field="solution",
    )
    got = _env(cfg).tasks("train", cfg.task, 0)[9]
    assert (got["answer"], got["solution"]) == ("18", "18")
    code = [{**r, "solution": "    return 2 * x\n"} for r in rows]  # a text: as it is, indentation kept
    cfg = _cfg(
        tmp_path,
        train=str(_jsonl(tmp_path / "tr2.jsonl", code[:30])),
        heldout=str(_jsonl(tmp_path / "te2.jsonl", code[30:])),
        solution_field="solution",
    )
    assert _env(cfg).tasks("train", cfg.task, 0)[0]["solution"] == "    return 2 * x\n"
