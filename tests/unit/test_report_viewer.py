"""The report's rollout viewer (no run): every sample's text escaped, reward components and the environment's
outcome shown, a multi-turn episode turn by turn."""

from __future__ import annotations

import rl_core.pipeline.report as report


def test_the_viewer_shows_components_outcomes_and_turns(monkeypatch):
    episode = {
        "prompt": "<script>alert(1)</script> 2+2=",
        "completion_text": "call calc",
        "answer": "4",
        "reward": 1.0,
        "correct": 1.0,
        "env_correct": True,
        "env_parsed": "4",
        "finish_reason": "stop",
        "turns": ["call calc(2+2)", "4"],
        "observations": ["result: 4"],
    }
    monkeypatch.setattr(
        report, "samples", lambda store, run, k, n: {"best": [episode], "worst": [], "random": []}
    )
    page = report._samples_html(None, "r", 1, 3)
    assert "<script>" not in page and "&lt;script&gt;" in page  # a completion cannot script the report
    assert "<th>correct</th>" in page and "<th>env_parsed</th>" in page
    turns = page[page.index("<ol class=turns>") :]
    assert turns.index("call calc(2+2)") < turns.index("result: 4") < turns.index("<pre>4</pre>")
