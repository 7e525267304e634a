"""Every policy-gradient algorithm end to end: `rlfoundry run` on the smoke config (tiny model, 2 iterations)
with ``train.algorithm`` set, all in one state dir so they share one warmed-up base model (only the first
run pays for the warm-up). GRPO, the default, is the smoke run itself (test_run_end_to_end). PPO's critic is
a stored output of each train stage and an input of the next; replaying train reproduces it bit for bit."""

from __future__ import annotations

import pytest

from tests.conftest import replayed_identical, run_cli, show_json

# The HF rollout engine: the algorithms are the trainer's business, and it starts in a second where vLLM takes
# ~20 s per process (vLLM + DeepSpeed runs end to end in test_run_end_to_end and test_own_model).
ENGINE = ["rollout.engine=hf"]
# Each algorithm with one KL variant, so that every estimator and both places run end to end too.
RUNS = {
    "drgrpo": ["train.kl_coef=0.05", "train.kl_estimator=k2"],
    "rloo": ["train.kl_coef=0.05", "train.kl_estimator=k1", "train.kl_in=reward"],
    "dapo": [],
    "gspo": [],
    "cispo": ["train.kl_coef=0.05"],
    "ppo": ["train.kl_coef=0.05", "train.kl_in=reward"],
}


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    return tmp_path_factory.mktemp("pg-state")


def _run(state, algo: str) -> dict:
    sets = [f"train.algorithm={algo}", *RUNS[algo], "tracking.enabled=false", "eval.every=2", *ENGINE]
    args = ["run", "configs/smoke.yaml", "--run-id", f"pg-{algo}"]
    r = run_cli([*args, *(a for s in sets for a in ("--set", s))], state)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return show_json(state, f"pg-{algo}")


def _train(data: dict, k: int) -> dict:
    return data["iterations"][k - 1]["stages"]["train"]["metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(set(RUNS) - {"ppo"}))
def test_algorithm_runs_end_to_end(state, algo):
    data = _run(state, algo)
    hashes = [data["base"]["policy_sha256"]] + [it["policy_sha256"] for it in data["iterations"]]
    assert len(hashes) == 3 and len(set(hashes)) == 3  # each iteration moved the policy
    assert data["iterations"][1]["stages"]["evaluate"]["status"] == "committed"
    first = _train(data, 1)
    if algo == "dapo":
        score = data["iterations"][0]["stages"]["score_rewards"]["metrics"]
        assert "dropped_groups" in score and score["overlong_mean"] <= 0
        assert first["dropped_groups"] == score["dropped_groups"]
        assert first["kept_rows"] == 32 - score["dropped_rows"]
    if algo == "rloo":  # the KL went into the reward: reported there, not as a loss term (iteration 2
        # samples from the updated policy, so its KL to the warm-up reference is no longer 0)
        second = _train(data, 2)
        assert first["kl"] == 0.0 and second["kl"] == 0.0 and second["reward_kl_mean"] != 0.0
    if algo in (
        "drgrpo",
        "cispo",
    ):  # a KL loss term to the warm-up policy: exactly 0 at iteration 1, then > 0
        assert _train(data, 2)["kl"] > 0.0


@pytest.mark.slow
def test_ppo_critic_is_stored_reloaded_and_replayed_bit_for_bit(state):
    data = _run(state, "ppo")
    one, two = _train(data, 1), _train(data, 2)
    assert one["value_loss"] > 0 and two["value_loss"] > 0 and two["reward_kl_mean"] != 0.0
    from rl_core.artifacts.stage import committed
    from rl_core.artifacts.store import Store

    store = Store(str(state / "store"))
    m1, m2 = (committed(store, "pg-ppo", k, "train") for k in (1, 2))
    assert "critic" not in m1.inputs  # iteration 1 starts the critic from the warmed-up base
    assert m2.inputs["critic"].sha256 == m1.outputs["critic"].sha256  # the stored critic is the next input
    assert m2.outputs["critic"].sha256 != m1.outputs["critic"].sha256
    (report,) = replayed_identical(state, "pg-ppo", 2, ["train"]).values()
    assert set(report["artifacts"]) == {"checkpoint", "optimizer", "critic"}


class _Payload:
    """Unpickled, this runs a shell command: what a pickle planted in the store would do to the trainer."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["optimizer", "critic"])
def test_a_pickle_planted_in_the_store_is_refused_and_never_runs(state, tmp_path, planted):
    """Whoever can write the bucket can rewrite a state file and the manifest hash that guards it: the train
    stage that reads it refuses it as a pickle, naming it, and the payload never runs
    (rl_core.artifacts.safe_state)."""
    import hashlib
    import io
    import json

    import torch

    from tests.conftest import replay_cli

    if not (state / "store" / "pg-ppo" / "iter-0002" / "train" / "_manifest.json").exists():
        _run(state, "ppo")
    marker = tmp_path / "payload-ran"
    buf = io.BytesIO()
    torch.save({"state": {}, "param_groups": [], "x": _Payload(marker)}, buf)
    bad = buf.getvalue()
    path = state / "store" / "pg-ppo" / "iter-0001" / "train" / f"{planted}.safetensors"
    manifests = [state / "store" / "pg-ppo" / f"iter-000{k}" / "train" / "_manifest.json" for k in (1, 2)]
    saved = {p: p.read_bytes() for p in [path, *manifests]}
    try:
        path.write_bytes(bad)
        for m in manifests:  # the attacker rewrites the hashes too: they live in the same bucket
            text = m.read_text().replace(
                hashlib.sha256(saved[path]).hexdigest(), hashlib.sha256(bad).hexdigest()
            )
            m.write_text(text)
        assert hashlib.sha256(bad).hexdigest() in manifests[1].read_text()
        r = replay_cli(state, "pg-ppo", 2, ["train"])
        assert r.returncode != 0, r.stdout[-2000:]
        assert f"{planted}.safetensors" in r.stderr and "pickle" in r.stderr, r.stderr[-3000:]
        assert not marker.exists(), "the planted payload ran"
    finally:
        for p, data in saved.items():
            p.write_bytes(data)
    assert (
        json.loads(manifests[1].read_text())["inputs"][planted]["sha256"]
        == hashlib.sha256(saved[path]).hexdigest()
    )
