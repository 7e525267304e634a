"""Images in every turn, without a model: shape_rounds shows a new picture with every observation and scores
the whole episode; the images store keeps each picture once under its digest and refuses a missing or
altered one by name."""

from __future__ import annotations

import pytest

from envs.base import make_env
from envs.shapes import count
from rl_core.artifacts.images import digest, load_images, put_images, row_images
from rl_core.artifacts.store import Store
from rl_core.schema.config import load_config


def test_shape_rounds_shows_a_picture_per_turn_and_scores_every_round():
    cfg = load_config("configs/shapes.yaml", ["task.train_size=50", "task.heldout_size=10"])
    env = make_env("shape_rounds", {"rounds": 3})
    assert env.max_turns == 3
    task = env.tasks("train", cfg.task, 0)[0]
    assert env.reset(task, 0) == f"count {task['rounds'][0]['question']}\n"
    answers = [str(count(r["scene"], r["question"])) for r in task["rounds"]]
    assert env.image(task) != make_env("shape_rounds", {"rounds": 3}).image(
        env.tasks("train", cfg.task, 0)[1]
    )
    shown = []
    for k, a in enumerate(answers):
        res = env.step(a)
        if k < 2:
            assert not res.done and res.observation == f"count {task['rounds'][k + 1]['question']}\n"
            assert len(res.images) == 1 and res.outcome["correct"] is False  # so far: not yet solved
            shown.append(res.images[0])
    assert res.done and res.outcome["correct"] and res.outcome["digit_match"] == 1.0
    assert len({digest(b) for b in [env.image(task), *shown]}) == 3  # a new picture every turn
    env.reset(task, 0)
    env.step(answers[0])
    env.step("9")
    assert not env.step(answers[2]).outcome["correct"]  # one round wrong: the episode is not solved


def test_images_are_stored_once_by_digest_and_checked_when_read(tmp_path):
    store = Store(f"file://{tmp_path}/store")
    run = store.run_uri("r")
    a, b = b"\x89PNG a", b"\x89PNG b"
    assert put_images(store, run, [a, b, a]) == [digest(a), digest(b), digest(a)]
    assert sorted(p.name for p in (tmp_path / "store" / "r" / "images").iterdir()) == sorted(
        f"{digest(x)}.png" for x in (a, b)
    )
    assert row_images(store, run, [[digest(a)], [], [digest(b)]]) == (a, b)
    (tmp_path / "store" / "r" / "images" / f"{digest(b)}.png").write_bytes(b"tampered")
    with pytest.raises(ValueError, match=f"images/{digest(b)}.png is corrupt"):
        load_images(store, run, [digest(b)])
    with pytest.raises(ValueError, match="is missing from the store"):
        load_images(store, run, ["0" * 64])


def test_vllm_never_samples_the_image_placeholder_whatever_the_config_layout(tmp_path):
    """vLLM's allow-list leaves out the image placeholder, from a config with a ``text_config`` (Idefics3,
    Qwen-VL as transformers 5 saves it) and from one with the vocabulary at the top (Qwen2-VL as the hub
    ships it)."""
    import json

    from rl_core.models.vision import allowed_token_ids

    for i, cfg in enumerate(
        [
            {"model_type": "qwen2_vl", "image_token_id": 7, "text_config": {"vocab_size": 50}},
            {"model_type": "qwen2_vl", "image_token_id": 7, "vocab_size": 50},
        ]
    ):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        assert allowed_token_ids(folder) == [t for t in range(50) if t != 7]
