"""The reward model's training data (preference pairs the environment itself checks), a deterministic training
run with its held-out accuracy, and a reward component whose server is unreachable failing the stage by
name (never a zero)."""

from __future__ import annotations

import json

import pytest

from rl_core.artifacts.paths import free_port
from rl_core.run.context import RunContext
from rl_core.schema.config import load_config
from rl_core.scoring.reward_client import RewardServerError, reward_model
from rl_core.scoring.reward_model import Pair, preference_pairs, score_text, train_reward_model
from tests.conftest import run_cli

TASKS = [
    {"prompt": "2+3=", "answer": "5"},
    {"prompt": "1+4=", "answer": "5"},
    {"prompt": "9-7=", "answer": "2"},
]


def test_pairs_put_the_answer_above_wrong_answers_the_environment_rejects():
    pairs = preference_pairs("arithmetic", {}, TASKS, seed=3)
    assert pairs == preference_pairs("arithmetic", {}, TASKS, seed=3)
    assert pairs != preference_pairs("arithmetic", {}, TASKS, seed=4)
    for p in pairs:
        truth = str(eval(p.prompt[:-1]))  # the tasks' own arithmetic, computed here
        assert p.chosen == truth and p.rejected != truth
    near = [p for p in pairs if abs(int(p.rejected) - int(p.chosen)) <= 9 and p.rejected not in ("5", "2")]
    assert len(near) == 3  # one near miss per task, off by 1..9
    # 2+3= and 1+4= share the answer 5: another task's answer is a wrong answer only for 9-7= (and 5 there)
    others = [p for p in pairs if p not in near]
    assert all(p.rejected in ("5", "2") for p in others)
    assert Pair("2+3=", "5", "5") not in pairs and Pair("1+4=", "5", "5") not in pairs


def test_pairs_need_reference_answers():
    with pytest.raises(ValueError, match="no text prompts with reference answers"):
        preference_pairs("arithmetic", {}, [{"prompt": "2+3="}], seed=0)


def test_score_text_is_prompt_then_completion():
    assert score_text("12+30=", "42") == "12+30=42"


def test_training_is_deterministic_and_reports_heldout_accuracy(tmp_path):
    cfg = load_config(
        "configs/smoke.yaml",
        [
            "reward.model.train_steps=4",
            "reward.model.train_batch=8",
            "reward.model.train_tasks=100",
            "task.train_size=100",
        ],
    )
    a = train_reward_model(cfg, tmp_path / "a")
    b = train_reward_model(cfg, tmp_path / "b")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model.safetensors"
    ).read_bytes()
    assert a["heldout_pairwise_accuracy"] == b["heldout_pairwise_accuracy"]
    assert 0.0 <= a["heldout_pairwise_accuracy"] <= 1.0 and a["heldout_pairs"] >= 256
    conf = json.loads((tmp_path / "a" / "config.json").read_text())
    assert conf["architectures"] == ["Qwen2ForSequenceClassification"] and len(conf["id2label"]) == 1
    assert conf["pad_token_id"] is not None
    assert (
        json.loads((tmp_path / "a" / "reward_model.json").read_text())["heldout_pairwise_accuracy"]
        == a["heldout_pairwise_accuracy"]
    )


def test_an_unreachable_reward_server_fails_the_component_naming_it(tmp_path, state_dir):
    cfg = load_config(
        "configs/smoke.yaml",
        ["reward.model.train_steps=1", "reward.model.train_tasks=100", "task.train_size=100"],
    )
    train_reward_model(cfg, tmp_path / "rm")
    url = f"http://127.0.0.1:{free_port()}"
    cfg = load_config(
        "configs/smoke.yaml", [f"reward.model.url={url}", f"reward.model.path={tmp_path / 'rm'}"]
    )
    with pytest.raises(RewardServerError, match=url.replace(".", r"\.")):
        reward_model(RunContext(cfg, "rm-unit"), ["2+3="], ["5"], [None], 1)


def test_without_a_server_or_a_launcher_the_component_says_what_to_set(tmp_path, state_dir):
    cfg = load_config("configs/smoke.yaml", [f"reward.model.path={tmp_path}"])
    with pytest.raises(ValueError, match="reward.model.url is empty"):
        reward_model(RunContext(cfg, "rm-unit"), ["2+3="], ["5"], [None], 1)
    with pytest.raises(ValueError, match="set reward.model.path"):
        reward_model(RunContext(load_config("configs/smoke.yaml", []), "rm-unit"), ["2+3="], ["5"], [None], 1)


def test_up_refuses_a_reward_server_folder_that_is_no_reward_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {"0": "a", "1": "b"}}))
    for f in ("model.safetensors", "tokenizer.json"):
        (tmp_path / f).write_text("")
    r = run_cli(["up", "--reward-server", str(tmp_path)], tmp_path / "state")
    assert r.returncode == 2 and "not a one-label (scalar) model: 2 labels" in r.stderr
    r = run_cli(["up", "--reward-server", str(tmp_path / "none")], tmp_path / "state")
    assert r.returncode == 2 and "is not a folder" in r.stderr


def test_a_config_with_reward_model_needs_its_folder():
    from rl_core.schema.config import ConfigError

    with pytest.raises(ConfigError, match="reward.model.path"):
        load_config("configs/smoke.yaml", ["reward.weights={correct: 1.0, reward_model: 0.1}"])


class _Scorer:
    """A reward model that dies (its actor or server gone) after ``dies_after`` batches, as a Ray actor on
    a lost node does; the client's retry and restart logic runs unchanged on it."""

    def __init__(self, name: str, dies_after: int | None = None):
        self.name, self.dies_after = name, dies_after
        self.placement = {"ray_address": "10.0.0.1:6379", "reward_model": {"node": name}}
        self.batches, self.dead, self.closed = 0, False, False

    def healthy(self) -> bool:
        return not self.dead

    def classify(self, ids: list[list[int]]) -> list[float]:
        from rl_core.run.cluster import DIED
        from rl_core.scoring.reward_client import Transient

        if self.dead or (self.dies_after is not None and self.batches >= self.dies_after):
            self.dead = True
            raise Transient(DIED)
        self.batches += 1
        return [float(sum(i)) - 0.5 for i in ids]

    def close(self) -> None:
        self.closed = True


def test_a_dead_reward_actor_is_replaced_and_the_batch_scored_again(tmp_path, state_dir):
    from rl_core.scoring.reward_client import RewardClient

    cfg = load_config(
        "configs/smoke.yaml",
        ["reward.model.train_steps=1", "reward.model.train_tasks=100", "task.train_size=100"],
    )
    train_reward_model(cfg, tmp_path / "rm")
    texts = [f"{a}+{a}={2 * a}" for a in range(40)]
    first, spares = _Scorer("node-a", dies_after=2), [_Scorer("node-b"), _Scorer("node-c")]
    owned = RewardClient(first, tmp_path / "rm", batch_size=8, timeout_s=5, retries=2, restart=spares.pop)
    want = RewardClient(_Scorer("ref"), tmp_path / "rm", batch_size=8, timeout_s=5, retries=0).score(texts)
    assert owned.score(texts) == want  # the dead actor's batch scored again on its replacement, not 0
    assert owned.counts == {"requests": 6, "retries": 1, "restarts": 1} and first.closed
    assert owned.url == "node-c" and owned.scorer.placement["reward_model"] == {"node": "node-c"}
    # an actor the client cannot replace: the stage fails naming it and the rows, never scores them 0
    alone = RewardClient(
        _Scorer("node-d", dies_after=1), tmp_path / "rm", batch_size=8, timeout_s=5, retries=1
    )
    with pytest.raises(
        RewardServerError, match=r"reward server node-d: its actor died .* \(rows 8\.\.15; 2 attempts"
    ):
        alone.score(texts)


def test_on_a_cluster_the_reward_model_is_counted_among_the_actors_it_needs():
    from rl_core.models.placement import Machine, plan
    from rl_core.run.preflight import cluster_needs, shortfall

    over = ["cluster.ray_address=10.0.0.1:6379", "reward.model.path=/rm", "train.world_size=2"]
    with_rm = load_config("configs/smoke.yaml", [*over, "reward.weights={correct: 1.0, reward_model: 0.0}"])
    counts, need = cluster_needs(with_rm, plan(with_rm, Machine.this()))
    assert counts["reward"] == 1 and need == {"CPU": float(sum(counts.values()))}
    line = shortfall(with_rm, counts, need, {"CPU": need["CPU"] - 1})
    assert line.endswith(
        f"the reward model's actor need {need['CPU']:g} CPU (one CPU each): add nodes or lower them"
    )
    served = load_config(
        "configs/smoke.yaml",
        [*over, "reward.weights={correct: 1.0, reward_model: 0.5}", "reward.model.url=http://127.0.0.1:9"],
    )
    # a running server: nothing placed
    assert cluster_needs(served, plan(served, Machine.this()))[0]["reward"] == 0


def test_a_special_tokens_text_in_a_completion_stays_text():
    """The policy writes the completion: ``<|im_end|>`` or the pad token's text in it became that token for
    the reward model (a turn boundary it was never trained across; a pad id inside a sequence moved the HF
    head's pooling to an earlier token, and its score away from the vLLM server's by 0.27)."""
    from rl_core.scoring.reward_model import encode
    from tests.model_folders import build_qwen3_tokenizer

    tok = build_qwen3_tokenizer()
    specials = set(tok.all_special_ids)
    for text in ("12<|im_end|>", "7<|endoftext|>", "<|im_start|>user\nsay 1<|im_end|>"):
        ids = encode(tok, [text], 64)[0]
        assert not specials & set(ids), (text, tok.convert_ids_to_tokens(ids))
        assert tok.decode(ids) == text
    assert encode(tok, ["12"], 64) == [
        tok("12", add_special_tokens=False)["input_ids"]
    ]  # plain text: as before


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (
            {"data": [{"index": 5, "probs": [0.1]}, {"index": 6, "probs": [5.0]}]},
            "indices [5, 6] for 2 inputs",
        ),
        ({"data": [{"index": 0, "probs": [0.1]}]}, "indices [0] for 2 inputs"),
        ({"object": "list"}, "not a /classify answer"),
        ({"data": [{"index": 0, "probs": []}, {"index": 1, "probs": [1.0]}]}, "one score per input"),
        ({"data": [{"index": 0, "probs": [0.3, 0.7]}, {"index": 1, "probs": [0.3, 0.7]}]}, "[2] labels"),
        ({"data": [{"index": 0, "probs": ["high"]}, {"index": 1, "probs": [1.0]}]}, "not a number"),
    ],
)
def test_a_malformed_classify_answer_names_the_server(answer, says):
    """A reward server's answer that is not one score per input in order is refused, naming the server:
    before, repeated or shifted indices were paid to the wrong rows and a two-label head read its first."""
    from rl_core.scoring.reward_client import read_scores

    with pytest.raises(RewardServerError, match="reward server http://127.0.0.1:9/") as e:
        read_scores("http://127.0.0.1:9/", answer, 2)
    assert says in str(e.value)
