"""Computer use from pixels on MiniWoB++ (envs/miniwob.py), in headless Chromium: the oracle that reads the
DOM solves held-out pages of every task (one of them multi-step) through the policy's own action space;
episodes are hermetic (a fresh environment replaying the actions sees the same screenshots); a malformed or
off-screen action is an error observation and the episode goes on. Then a run of a user's Idefics3 folder on
vLLM: a screenshot in every turn, its digests in the rollouts and the pictures stored once each, the trainer's
logprobs the engine's within 1e-3, the execute_envs replay finding the same pictures, generate replaying bit
for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from envs.base import make_env
from envs.miniwob import HEIGHT, WIDTH, oracle_actions
from rl_core.artifacts.images import digest
from rl_core.schema.config import load_config
from tests.conftest import cli_env, replayed_identical, run_cli
from tests.model_folders import write_idefics3_folder

TASKS = ["click-button", "click-link", "enter-text"]


@pytest.mark.slow
def test_the_oracle_solves_unseen_pages_and_episodes_are_hermetic():
    import io

    from PIL import Image

    cfg = load_config("configs/miniwob.yaml", ["task.train_size=20", "task.heldout_size=12"])
    env = make_env("miniwob", {"tasks": TASKS})
    held = env.tasks("heldout", cfg.task, cfg.experiment.seed)
    train = env.tasks("train", cfg.task, cfg.experiment.seed)
    assert {t["key"] for t in held}.isdisjoint(t["key"] for t in train)  # unseen seeds
    assert {t["page"] for t in held} == set(TASKS)
    for t in held:
        actions = oracle_actions(env, t)
        assert env.reset(t, 0).strip()
        shots = []
        for a in actions:
            res = env.step(a)
            shots.append(res.images)
        assert res.done and res.outcome["correct"] and res.outcome["well_formed"], (t["key"], actions)
        if t["page"] == "enter-text":  # multi-step: a click, typing, a click
            assert len(actions) == 3 and all(len(s) == 1 for s in shots[:-1])
            # the same actions from a fresh environment: the same pictures, byte for byte
            again = make_env("miniwob", {"tasks": TASKS})
            again.reset(t, 0)
            assert [again.step(a).images for a in actions[:-1]] == shots[:-1]
    t = held[0]
    first = env.image(t)
    assert Image.open(io.BytesIO(first)).size == (WIDTH, HEIGHT)
    env.reset(t, 0)
    for bad in ("jump", f"click({WIDTH},3)", 'type("x'):
        res = env.step(bad)
        assert not res.done and res.observation.startswith("error:") and res.images == (first,), bad
    res = env.step(oracle_actions(env, t)[0])  # the episode went on: it can still be solved
    if t["page"] != "enter-text":
        assert res.done and res.outcome["correct"] and not res.outcome["well_formed"]
        assert res.outcome["invalid_actions"] == 3


@pytest.mark.slow
def test_the_curves_tasks_oracle_solves_them_and_the_flawed_teacher_fails_them():
    """The tasks benchmarks/miniwob_curve.py learns: the oracle solves unseen pages of each; the flawed
    teacher's one mistake (a name typed without its last letter; a click 40 px right and below) fails every
    page whose target is smaller than that, and is the oracle's actions otherwise."""
    from envs.miniwob import ORACLE_TASKS

    names = ["click-test", "focus-text", "click-color", "enter-text", "click-collapsible-nodelay"]
    assert set(names) <= set(ORACLE_TASKS)
    cfg = load_config("configs/miniwob.yaml", ["task.train_size=10", "task.heldout_size=14"])
    env = make_env("miniwob", {"tasks": names})
    held = env.tasks("heldout", cfg.task, cfg.experiment.seed)
    assert {t["page"] for t in held} == set(names)
    for t in held:
        good, bad = env.teacher_actions(t, False), env.teacher_actions(t, True)
        assert good == oracle_actions(env, t)
        diff = [(a, b) for a, b in zip(good, bad, strict=True) if a != b]
        assert len(diff) == 1, (good, bad)
        solved = []
        for actions in (good, bad):
            env.reset(t, 0)
            for a in actions:
                res = env.step(a)
            solved.append(bool(res.done and res.outcome["correct"]))
        assert solved[0], (t["key"], good)
        if t["page"] != "click-test":  # its button may be larger than the slip
            assert not solved[1], (t["key"], bad)
        if t["page"] == "enter-text":
            assert diff[0][1] == diff[0][0][:-3] + '")'  # the typed name loses its last letter


@pytest.mark.slow
def test_an_episode_starts_with_nothing_the_last_one_focused():
    """A browser whose last episode on the page focused its text field shows the next episode as a fresh
    browser does: a replay's screenshots do not depend on which episode the browser ran before (they did:
    enter-text's field kept its focus ring, and replays of episodes of malformed actions differed)."""
    from envs.miniwob import Browser, parse_action

    env = make_env("miniwob", {"tasks": ["enter-text"]})
    click = parse_action(oracle_actions(env, {"page": "enter-text", "page_seed": 5})[0])
    used, fresh = Browser(), Browser()
    try:
        used.start("enter-text", 5)
        used.act(click)  # the field focused
        used.start("enter-text", 5)
        fresh.start("enter-text", 5)
        assert used.screenshot() == fresh.screenshot()
    finally:
        used.close()
        fresh.close()


def test_no_chromium_is_refused_before_work_naming_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("MINIWOB_CHROME_BINARY", raising=False)
    monkeypatch.delenv("MINIWOB_CHROMEDRIVER", raising=False)
    with pytest.raises(RuntimeError, match="not found: chromium, chromedriver"):
        make_env("miniwob", {})
    # the command (its own code, in this process: it stops before any server or stage): one line naming what
    # is missing, exit 2, no traceback, no run started
    from typer.testing import CliRunner

    from flows.cli import app

    cmd = ["run", "configs/miniwob.yaml", "--run-id", "nobrowser"]
    r = CliRunner().invoke(app, cmd, env={**cli_env(tmp_path), "PATH": str(tmp_path)})
    said = (r.output[-2000:], r.exception)
    assert r.exit_code == 2 and "not found: chromium, chromedriver" in r.output, said
    assert "Traceback" not in r.output and not (tmp_path / "store" / "nobrowser").exists()
    with pytest.raises(Exception, match="no MiniWoB\\+\\+ page no-such-task"):
        make_env("miniwob", {"tasks": ["no-such-task"]})


@pytest.mark.slow
def test_the_warm_up_plays_the_teachers_episodes_as_rl_would(tmp_path, monkeypatch):
    """The teacher's actions (the oracle's; a flawed one's with its one mistake) played through the
    generation's own turns by a scripted engine: labels on exactly the teacher's actions, each closed by EOS
    (none on the empty turns a failed flawed episode goes on with), every screenshot of the episode in the
    sequence and in the vision tensors."""
    from rl_core.models.model import load_tokenizer
    from rl_core.run.context import RunContext
    from rl_core.training.sft import _warmup_batch

    monkeypatch.setenv("RLFOUNDRY_STATE_DIR", str(tmp_path / "state"))
    folder = write_idefics3_folder(tmp_path / "idefics3")
    over = [f"model.path={folder}", "task.train_size=12", "task.heldout_size=10", "model.max_position=256"]
    over.append("task.env_args.tasks=[click-test,click-color,enter-text]")  # the pages the checks below name
    ctx = RunContext(load_config("configs/miniwob.yaml", [*over, f"store.uri={tmp_path / 'store'}"]), "t")
    ref = ctx.store.put_dir(folder, f"{ctx.store.root}/t/src")
    tok = load_tokenizer(folder)
    marker = json.loads((folder / "config.json").read_text())["image_token_id"]
    tasks = ctx.train_tasks[:4]
    # two click-test pages (the same prompt and as many placeholders), one flawed: each its own script
    flawed = [True, True, False, True]
    ids, attn, labels, extra = _warmup_batch(ctx, tok, folder, tasks, flawed, ref)
    shots = 0
    for i, t in enumerate(tasks):
        taught = tok.decode([x for x in labels[i].tolist() if x != -100])
        actions = ctx.env.teacher_actions(t, flawed[i])
        # labels on the teacher's actions only: a flawed episode's empty turns after them teach nothing
        assert taught == "".join(a + tok.eos_token for a in actions), (taught, actions)
        if not flawed[i]:  # the oracle's episode ends on its last action: one screenshot before each
            assert int((ids[i] == marker).sum()) == 20 * len(actions)
        shots += int((ids[i] == marker).sum()) // 20
    # the flawed click-test episode missed its button and went on (empty turns, a screenshot each)
    assert [t["page"] for t in tasks[2:]] == ["click-test"] * 2 and int((ids[3] == marker).sum()) > 20
    assert extra["pixel_values"].shape[0] == 4 and int(attn.sum()) == int((ids != tok.pad_token_id).sum())
    real = (extra["pixel_values"].flatten(2).abs().sum(-1) > 0).sum()
    assert int(real) == 5 * shots  # each screenshot: 2x2 crops and the global image


@pytest.mark.slow
def test_a_run_from_pixels_on_the_built_in_idefics3_policy(tmp_path):
    """No model.path: init builds the Idefics3 policy the environment names, and every stage reads it as a
    user's SmolVLM folder (a user's folder on vLLM: tests/integration/test_vlm_families.py; on this
    environment: the curve's smoke, tests/integration/test_benchmarks_smoke.py)."""
    shape = ["model.hidden_size=64", "model.num_layers=2", "model.intermediate_size=128"]
    shape.append("model.vision_layers=1")
    args = [
        *(
            "--set",
            "experiment.iterations=2",
            "--set",
            "tracking.enabled=false",
        ),
        *(x for s in shape for x in ("--set", s)),
        *("--set", "task.train_size=24", "--set", "task.heldout_size=10", "--set", "eval.every=2"),
        *(
            "--set",
            "rollout.prompts_per_iteration=6",
            "--set",
            "rollout.n=2",
            "--set",
            "task.env_args.max_turns=3",
        ),
        *("--set", "model.max_position=256", "--set", "train.micro_batch_size=12", "--set", "eval.samples=1"),
        *("--set", "eval.pass_k=[1]", "--set", "warmup.steps=2", "--set", "warmup.batch_size=4"),
        *("--set", "warmup.teacher_error_rate=0.25"),
    ]
    r = run_cli(["run", "configs/miniwob.yaml", "--run-id", "web", *args], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    folder = next((tmp_path / "store" / "_base").glob("*/iter-0000/init/checkpoint"))
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "idefics3" and config["text_config"]["hidden_size"] == 64
    assert (folder / "processor_config.json").is_file() and (folder / "chat_template.jinja").is_file()
    # its pixels normalized by the run's own training screens (all 24 of them), not SmolVLM's 0.5/0.5
    images = json.loads((folder / "processor_config.json").read_text())["image_processor"]
    init = json.loads((folder.parent / "_manifest.json").read_text())["metrics"]
    assert init["pixel_screens"] == 24
    assert images["image_mean"][0] > 0.9 and images["image_std"][0] < 0.2, images  # a mostly white page
    marker = config["image_token_id"]
    stored = {p.stem: p.read_bytes() for p in (tmp_path / "store" / "web" / "images").glob("*.png")}
    assert stored and all(digest(b) == name for name, b in stored.items())  # content-addressed, once each
    later = 0
    for k in (1, 2):
        it = tmp_path / "store" / "web" / f"iter-{k:04d}"
        df = pd.read_parquet(it / "generate" / "rollouts.parquet")
        assert len(df) == 12
        for row in df.itertuples():
            turns = [list(t) for t in row.images]
            assert all(d in stored for t in turns for d in t)
            seq = list(row.prompt_ids) + list(row.completion_ids)
            # a 160x210 screenshot: 2x2 crops and the global image, 4 placeholders each
            assert seq.count(marker) == 20 * sum(len(t) for t in turns)
            later += sum(len(t) for t in turns[1:])
        env = json.loads((it / "execute_envs" / "_manifest.json").read_text())["metrics"]
        assert env.get("replay_mismatches", 0) == 0, env
        train = json.loads((it / "train" / "_manifest.json").read_text())["metrics"]
        assert train["logprob_mismatch_max"] < 1e-3, (k, train["logprob_mismatch_max"])
    assert later > 0  # screenshots after actions, not only the first
    base = next((tmp_path / "store" / "_base").glob("*/iter-0000/warmup/_manifest.json"))
    warm = json.loads(base.read_text())["metrics"]
    assert warm["steps"] == 2 and warm["final_loss"] == warm["final_loss"]  # the teacher's episodes, learnt
    replayed_identical(tmp_path, "web", 2, ["generate"])


def test_a_browser_leaves_nothing_in_the_temp_folder(monkeypatch):
    """Chromium leaves a folder of its own in the temp folder even after a clean quit (one a browser: the
    suite's left hundreds): the browser's scratch folder takes it, and its close removes that."""
    import shutil
    import tempfile

    from envs.miniwob import Browser

    # a short temp folder: the socket Chromium makes in it has a path of at most 108 bytes
    root = Path(tempfile.mkdtemp(prefix="rlf-t-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(root))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    try:
        b = Browser()
        b.start("click-button", 1)
        assert len(b.screenshot()) > 100
        assert [p.name for p in root.iterdir()] == [Path(b.scratch).name]
        b.close()
        assert list(root.iterdir()) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


# every action that needs no pixels: each key, a click on nothing, typing (into nothing focused)
BLIND = ["key(Enter)", "key(Space)", "key(Escape)", "key(Backspace)", "click(2,2)", 'type("a b")']


@pytest.mark.slow
def test_no_action_sequence_that_ignores_the_screen_solves_a_page():
    """A policy that never looks: every sequence of two pixel-free actions, on unseen pages of the curve's
    tasks. With Tab among the keys, Tab Tab solved every focus-text page and a click on nothing, Tab, Enter
    every click-test page; typed WebDriver key codes (Tab, Enter) did the same through ``type``."""
    import itertools

    env = make_env("miniwob", {"tasks": ["focus-text", "click-test"], "max_turns": 4, "browsers": 1})
    for page, seed in (("focus-text", 2001), ("click-test", 2002)):
        for first, second in itertools.product(BLIND, repeat=2):
            env.reset({"page": page, "page_seed": seed}, 0)
            res = env.step(first)
            if not res.done:
                res = env.step(second)
            assert not (res.done and res.outcome["correct"]), (page, first, second)
        for keys in ("\ue004", "\ue004\ue007", "\t", "\x00"):  # Tab, Tab Enter, and control characters
            env.reset({"page": page, "page_seed": seed}, 0)
            res = env.step(f'type("{keys}")')
            assert res.observation and res.observation.startswith("error: type(...)"), (page, keys)
            assert not res.done and not res.outcome["well_formed"]
        env.reset({"page": page, "page_seed": seed}, 0)
        res = env.step("key(Tab)")
        assert res.observation and res.observation.startswith("error: not an action"), page


@pytest.mark.slow
def test_an_episode_scores_the_same_whatever_its_browser_ran_before():
    """The same episodes in two orders on one browser: the same outcomes and pictures (a page's focus and
    where keyboard focus moves from were the last episode's: one stored action scored 1, 0, 1, 0)."""
    env = make_env("miniwob", {"tasks": ["focus-text", "click-test"], "browsers": 1})
    episodes = []
    for page, seed in (("focus-text", 7), ("click-test", 8), ("focus-text", 9)):
        task = {"page": page, "page_seed": seed}
        episodes += [(task, oracle_actions(env, task)[0]), (task, "click(2,2)"), (task, "key(Space)")]

    def play(order):
        got = {}
        for i in order:
            task, action = episodes[i]
            env.reset(task, 0)
            res = env.step(action)
            got[i] = (res.done, res.outcome["correct"], res.images)
        return got

    forward = play(range(len(episodes)))
    assert forward == play(reversed(range(len(episodes))))
    assert [forward[i][1] for i in range(0, len(episodes), 3)] == [True] * 3  # the oracle's click solves


@pytest.mark.slow
def test_a_browser_that_dies_is_replaced_and_the_episode_goes_on(monkeypatch):
    """Chromium killed under an episode (the OOM killer): the step runs again on a new browser, the pool
    holds no dead one; a browser that fails every time is an error naming the page, not a hang."""
    import psutil
    from selenium.common.exceptions import WebDriverException

    from envs.miniwob import POOL
    from envs.miniwob_browser import BrowserFailed

    POOL.close()  # none of the earlier tests' browsers: this one's the only one
    env = make_env("miniwob", {"tasks": ["click-test"], "browsers": 1})
    task = {"page": "click-test", "page_seed": 11}
    env.reset(task, 0)
    solve = oracle_actions(env, task)[0]
    assert not env.step("click(2,2)").done
    (dying,) = POOL.every
    driver = psutil.Process(dying.driver.service.process.pid)
    for p in driver.children(recursive=True):
        p.kill()
    res = env.step(solve)
    assert res.done and res.outcome["correct"]
    assert dying not in POOL.every and len(POOL.every) == 1

    def broken(self, name, seed):
        raise WebDriverException("tab crashed")

    monkeypatch.setattr("envs.miniwob_browser.Browser.start", broken)
    env.reset(task, 0)  # its first screen is known already
    with pytest.raises(BrowserFailed, match="click-test failed: WebDriverException.*a second browser"):
        env.step("click(2,2)")
    assert len(POOL.every) == 0  # both dropped, none left wedged
