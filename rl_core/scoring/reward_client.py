"""The served reward model as a reward component (``reward.weights: {reward_model: w}``): the score stage
sends each completion's prompt + completion text, as the reward model's token ids, in batches of
``reward.model.batch_size`` to a reward server (vLLM's pooling runner, ``infra/reward_server.py``) and stores
the raw scalar score per rollout (the ``reward_model`` column of rewards.parquet).

The server is ``reward.model.url``; when that is empty, a Ray actor on the run's cluster
(``cluster.ray_address``: ``rl_core/scoring/ray_reward.py``, the same engine in an actor's process), else one
the flow starts on ``reward.model.path`` (the context's ``reward_launcher``, set by the orchestration layer,
like the rollout servers'). Either is a ``Scorer`` the client sends token-id batches to. A request that fails
for a reason that is not the request's (connection refused or reset, a timeout of ``reward.model.timeout_s``,
a 5xx, an actor that died) is retried ``reward.model.retries`` times with exponential waits; before a retry, a
server (or actor) the flow started that no longer answers is restarted. When the retries are spent the stage
fails with an error naming the server, what happened and the rows: a completion is never scored 0 for the
server's failure. Metrics per iteration: ``reward_model_latency_s``, ``_requests``, ``_retries``,
``_restarts``.

    client = RewardClient("http://127.0.0.1:8011", "/tmp/rm", batch_size=64, timeout_s=60, retries=3)
    client.score(["2+3=5", "2+3=6"])   # [1.93, -0.41]
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
import tenacity

from envs.base import Outcome
from rl_core.models.model import load_tokenizer
from rl_core.run.context import RunContext
from rl_core.scoring.reward_model import encode, score_text
from rl_core.scoring.rewards import BatchScores, batch_builtin

SERVED_NAME = "reward"


class RewardServerError(RuntimeError):
    """The reward server failed or answered badly; the message names the server."""


class Transient(Exception):
    """A failure worth retrying (not the request's fault)."""


class HttpScorer:
    """A reward server's ``/classify`` over HTTP (``name``: its URL)."""

    def __init__(self, url: str, timeout_s: float):
        self.name = url.rstrip("/")
        self.http = httpx.Client(timeout=timeout_s)
        self.placement: dict[str, Any] | None = None  # where it runs: this machine

    def healthy(self) -> bool:
        try:
            return self.http.get(self.name + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def classify(self, ids: list[list[int]]) -> list[float]:
        body = {"model": SERVED_NAME, "input": ids, "use_activation": False}
        try:
            r = self.http.post(self.name + "/classify", json=body)
        except httpx.TransportError as e:  # refused, reset, timed out
            raise Transient(f"{type(e).__name__}: {e}") from e
        if r.status_code >= 500:
            raise Transient(f"HTTP {r.status_code}: {r.text[:200]}")
        if r.status_code != 200:
            raise RewardServerError(f"reward server {self.name}: HTTP {r.status_code}: {r.text[:300]}")
        return read_scores(self.name, r.json(), len(ids))

    def close(self) -> None:
        self.http.close()


def read_scores(server: str, answer: Any, n: int) -> list[float]:
    """The raw scores in a reward server's ``/classify`` answer to ``n`` inputs, in input order; an answer
    that is not one score for each input (a missing or repeated index, a head with several labels, no
    ``data``) is a ``RewardServerError`` naming the server, not a silently misassigned reward.

    >>> read_scores("s", {"data": [{"index": 1, "probs": [0.5]}, {"index": 0, "probs": [-2]}]}, 2)
    [-2.0, 0.5]
    >>> read_scores("s", {"data": [{"index": 0, "probs": [0.5]}, {"index": 0, "probs": [1.0]}]}, 2)
    Traceback (most recent call last):
    ...
    rl_core.scoring.reward_client.RewardServerError: reward server s: answered indices [0, 0] for 2 inputs
    """
    try:
        rows = sorted(answer["data"], key=lambda d: d["index"])
        indices = [d["index"] for d in rows]
        probs = [d["probs"] for d in rows]
    except (KeyError, TypeError) as e:
        what = f"{type(e).__name__}: {e}"
        raise RewardServerError(f"reward server {server}: not a /classify answer ({what})") from None
    if indices != list(range(n)):
        raise RewardServerError(f"reward server {server}: answered indices {indices} for {n} inputs")
    if not all(isinstance(p, list) and len(p) == 1 for p in probs):
        labels = sorted({len(p) if isinstance(p, list) else -1 for p in probs})
        raise RewardServerError(
            f"reward server {server}: a reward model has one score per input, the answer has {labels} labels"
        )
    try:
        return [float(p[0]) for p in probs]
    except (TypeError, ValueError) as e:
        raise RewardServerError(f"reward server {server}: a score that is not a number ({e})") from None


class Scorer(Protocol):
    """Where the reward model runs: a server over HTTP (``HttpScorer``) or a Ray actor on the run's cluster
    (``rl_core.scoring.ray_reward.RayRewardModel``). ``classify`` raises ``Transient`` for a failure worth a
    retry."""

    name: str
    placement: dict[str, Any] | None

    def healthy(self) -> bool: ...

    def classify(self, ids: list[list[int]]) -> list[float]: ...

    def close(self) -> None: ...


class RewardClient:
    def __init__(
        self,
        target: str | Scorer,
        path: str | Path,
        *,
        batch_size: int,
        timeout_s: float,
        retries: int,
        restart: Callable[[], str | Scorer] | None = None,
        on_close: Callable[[], None] | None = None,
    ):
        """``target``: a reward server's URL, or a ``Scorer``; ``restart``: brings a dead one back (its new
        URL or scorer), when this client owns it."""
        self.timeout_s = timeout_s
        self.scorer = self._scorer(target)
        self.tokenizer = load_tokenizer(path)
        self.max_len = int(json.loads((Path(path) / "config.json").read_text())["max_position_embeddings"])
        self.batch_size, self.retries = batch_size, retries
        self.restart, self.on_close = restart, on_close
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "retries": 0, "restarts": 0}
        if not self.scorer.healthy():
            self.scorer.close()  # an actor placed for it is released
            raise RewardServerError(f"reward server {self.url}: /health does not answer")

    def _scorer(self, target: str | Scorer) -> Scorer:
        return HttpScorer(target, self.timeout_s) if isinstance(target, str) else target

    @property
    def url(self) -> str:
        """The reward server's name in messages: its URL, or the Ray actor and its node."""
        return self.scorer.name

    def score(self, texts: list[str]) -> list[float]:
        """The reward model's raw score of each text, in order."""
        ids = encode(self.tokenizer, texts, self.max_len)
        out: list[float] = []
        with self.lock:
            for s in range(0, len(ids), self.batch_size):
                out += self._batch(ids[s : s + self.batch_size], s)
        return out

    def _batch(self, ids: list[list[int]], start: int) -> list[float]:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retries + 1),
            wait=tenacity.wait_exponential(multiplier=0.25, max=4),
            retry=tenacity.retry_if_exception_type(Transient),
            before_sleep=self._recover,
            reraise=True,
        )
        try:
            return retrying(self._post, ids)
        except Transient as e:
            raise RewardServerError(
                f"reward server {self.url}: {e} (rows {start}..{start + len(ids) - 1}; "
                f"{self.retries + 1} attempts{', restarted by this run' if self.restart else ''})"
            ) from e

    def _recover(self, state: tenacity.RetryCallState) -> None:
        self.counts["retries"] += 1
        if self.restart is not None and not self.scorer.healthy():
            self.scorer.close()
            self.scorer = self._scorer(self.restart())
            self.counts["restarts"] += 1

    def _post(self, ids: list[list[int]]) -> list[float]:
        self.counts["requests"] += 1
        values = self.scorer.classify(ids)
        if len(values) != len(ids) or not all(math.isfinite(v) for v in values):
            raise RewardServerError(
                f"reward server {self.url}: {len(values)} scores for {len(ids)} texts: {values}"
            )
        return values

    def close(self) -> None:
        self.scorer.close()
        if self.on_close is not None:
            self.on_close()


def held_client(ctx: RunContext) -> RewardClient:
    """The run's reward client (held by the context): on ``reward.model.url``, else on a server the context's
    launcher starts."""
    rm = ctx.cfg.reward.model
    if not rm.path:
        raise ValueError(
            "reward.weights has reward_model: set reward.model.path (the reward model folder; its tokenizer "
            "encodes the texts): rlfoundry reward-model train"
        )
    with ctx.held.reward_lock:
        if ctx.held.reward is None:
            ctx.held.reward = _new_client(ctx)
    return ctx.held.reward


def _new_client(ctx: RunContext) -> RewardClient:
    rm = ctx.cfg.reward.model
    opts: dict[str, Any] = {"batch_size": rm.batch_size, "timeout_s": rm.timeout_s, "retries": rm.retries}
    if rm.url:
        return RewardClient(rm.url, rm.path, **opts)
    if ctx.cfg.cluster.ray_address:  # a Ray actor on the run's cluster, like its rollout engines
        from rl_core.scoring.ray_reward import RayRewardModel

        actor = RayRewardModel(ctx, rm.path)
        return RewardClient(actor, rm.path, restart=lambda: RayRewardModel(ctx, rm.path), **opts)
    if ctx.reward_launcher is None:
        raise ValueError(
            "reward.model.url is empty and nothing here can start a reward server: set reward.model.url to a "
            "running one (rlfoundry up --reward-server)"
        )
    url, restart, stop = ctx.reward_launcher(rm.path)
    return RewardClient(url, rm.path, restart=restart, on_close=stop, **opts)


@batch_builtin("reward_model")
def reward_model(
    ctx: RunContext, prompts: list[str], completions: list[str], outcomes: list[Outcome], iteration: int
) -> BatchScores:
    """The served reward model's raw score of each prompt + completion (the same at every iteration)."""
    client = held_client(ctx)
    before, start = dict(client.counts), time.perf_counter()
    values = client.score([score_text(p, c) for p, c in zip(prompts, completions, strict=True)])
    metrics = {"latency_s": time.perf_counter() - start}
    metrics |= {k: float(v - before[k]) for k, v in client.counts.items()}
    return BatchScores(values=list(values), metrics=metrics)
