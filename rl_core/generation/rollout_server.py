"""The rollout engine as servers: vLLM's OpenAI-compatible API in processes of their own (started by the flow
with ``rollout.servers: N``, see ``infra/rollout_servers.py``, or pods named by ``rollout.server_urls``).

Token-in, token-out like the in-process engine: each request sends its prompt token ids with its own seed and
comes back with the sampled token ids (``return_tokens_as_token_ids``) and their processed logprobs, so the
outputs are the in-process engine's bit for bit, whichever server a request lands on. Requests are spread over
the healthy servers (request i to server i mod n, up to 32 in flight per server, which vLLM batches). Every
request carries the servers' token (``Authorization: Bearer``; ``infra/rollout_auth.py`` refuses any other).
Weights are synced through vLLM's ``/collective_rpc``: the committed checkpoint's store reference goes to the
worker method ``load_checkpoint``, and each server fetches it from the store itself, every file's sha256
checked — so a server that shares nothing with the flow but the store takes it — then ``/reset_prefix_cache``.
A checkpoint the train stage did not store (``train.checkpoint_every`` > 1) goes by path, which only servers
on the flow's machine can read. A server that stops answering is restarted by whoever started it (the
``restart`` callable), reloaded with the engine's current weights, and rejoins; external servers are waited
for. ``stats()`` reports the servers' prefix-cache hit rate from their ``/metrics``.

    engine = ServerEngine(["http://127.0.0.1:8001"], ckpt_dir, allowed_token_ids=None, token=token,
                          store_root=store.root)
    outs = engine.generate([Request([5, 6, 2], seed=1)], SamplingSpec(n=8, max_tokens=8))
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import tenacity

from rl_core.artifacts.manifest import ArtifactRef
from rl_core.generation.rollout import Completion, Request, SamplingSpec
from rl_core.generation.sampling import completion_text
from rl_core.models.model import load_tokenizer, stop_ids

# The flow's environment variable holding the token of the rollout servers it did not start
# (rollout.server_urls: pods, ``rlfoundry up --rollout-servers``); never a config field, so never stored.
ROLLOUT_TOKEN_ENV = "RLFOUNDRY_ROLLOUT_TOKEN"
_METRIC = re.compile(r"^vllm:prefix_cache_(queries|hits)_total\{[^}]*\}\s+([0-9.eE+-]+)$", re.M)


class RolloutServerError(RuntimeError):
    """A rollout server failed or answered badly; the message names the server."""


class ServerEngine:
    def __init__(
        self,
        urls: list[str],
        ckpt_dir: str | Path,
        *,
        allowed_token_ids: list[int] | None,
        restart: Callable[[int], str] | None = None,
        on_close: Callable[[], None] | None = None,
        # requests each server holds at once: vLLM batches what it holds (4 made a held-out pass of 32 prompts
        # take 1.5-8 s on two CPU servers; 32, as many as a batch usually has, ~0.4 s)
        per_server_in_flight: int = 32,
        timeout_s: float = 600.0,
        token: str = "",
        store_root: str = "",
    ):
        if not urls:
            raise ValueError("rollout servers: no server URL given")
        if not token:
            raise RolloutServerError(
                f"rollout servers {', '.join(urls)}: no token (set {ROLLOUT_TOKEN_ENV} to the servers' "
                "token; they refuse every request without it)"
            )
        self.store_root = store_root
        self.ref: ArtifactRef | None = None  # the checkpoint the servers hold, when it came from the store
        self.urls = list(urls)
        self.ckpt_dir = str(ckpt_dir)
        self.allowed = allowed_token_ids
        self.tokenizer = load_tokenizer(ckpt_dir)  # the completions' text (sampling.completion_text)
        self.stop = stop_ids(ckpt_dir, self.tokenizer)  # the model's own EOS ids
        self.restart = restart
        self.on_close = on_close
        self.restarts = 0
        self._counters: dict[str, dict[str, float]] = {}  # prefix-cache counters last seen, per URL
        self.in_flight = per_server_in_flight
        self.http = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {token}"})
        self.model = self._served_model(0)

    def _served_model(self, i: int) -> str:
        return self._call(i, "GET", "/v1/models")["data"][0]["id"]

    def _call(self, i: int, method: str, path: str, body: Any = None) -> Any:
        url = self.urls[i] + path
        try:
            r = self.http.request(method, url, json=body)
        except httpx.HTTPError as e:
            raise RolloutServerError(f"rollout server {self.urls[i]}: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise RolloutServerError(
                f"rollout server {self.urls[i]}: {method} {path} -> {r.status_code} {r.text[:300]}"
            )
        return r.json() if r.content else None

    def healthy(self, i: int) -> bool:
        try:
            return self.http.get(self.urls[i] + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def ensure_healthy(self) -> None:
        """Every server answers /health; one that does not is restarted (when this engine started it) and
        loaded with the current weights, else waited for (60 s), then the error names it."""
        for i in range(len(self.urls)):
            if self.healthy(i):
                continue
            if self.restart is not None:
                self.urls[i] = self.restart(i)
                self.restarts += 1
                self._load(i)
                continue
            deadline = time.monotonic() + 60
            while not self.healthy(i):
                if time.monotonic() > deadline:
                    raise RolloutServerError(
                        f"rollout server {self.urls[i]} is not healthy (no /health answer)"
                    )
                time.sleep(1)

    def _request(self, i: int, r: Request, spec: SamplingSpec) -> list[Completion]:
        if r.images:
            raise RolloutServerError("rollout servers: image prompts go through the in-process engine")
        body = {
            "model": self.model,
            "prompt": list(r.prompt_ids),
            "n": spec.n,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "max_tokens": spec.max_tokens,
            "seed": r.seed,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        if self.allowed is not None:
            body["allowed_token_ids"] = self.allowed
        if self.stop:
            body["stop_token_ids"] = self.stop
        out = self._retrying(i, body)
        comps = []
        for c in sorted(out["choices"], key=lambda c: c["index"]):
            lp = c["logprobs"]
            ids = [int(t.removeprefix("token_id:")) for t in lp["tokens"]]
            reason = "stop" if c["finish_reason"] == "stop" else "length"
            text = completion_text(self.tokenizer, ids, self.stop)
            comps.append(Completion(ids, [float(x) for x in lp["token_logprobs"]], text, reason))
        if len(comps) != spec.n:
            raise RolloutServerError(
                f"rollout server {self.urls[i]}: {len(comps)} completions, asked {spec.n}"
            )
        return comps

    def _retrying(self, i: int, body: dict[str, Any]) -> Any:
        """POST /v1/completions; a failed call is retried (3 times, backing off) after ensuring health."""

        def attempt() -> Any:
            try:
                return self._call(i, "POST", "/v1/completions", body)
            except RolloutServerError:
                self.ensure_healthy()
                raise

        retry = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(RolloutServerError),
            stop=tenacity.stop_after_attempt(3),
            wait=tenacity.wait_exponential(multiplier=0.5, max=5),
            reraise=True,
        )
        return retry(attempt)

    def generate(self, requests: list[Request], spec: SamplingSpec) -> list[list[Completion]]:
        """``spec.n`` completions per request, in request order; request i goes to server i mod n."""
        self.ensure_healthy()
        n = len(self.urls)
        with ThreadPoolExecutor(max_workers=n * self.in_flight) as pool:
            futures = [pool.submit(self._request, i % n, r, spec) for i, r in enumerate(requests)]
            return [f.result() for f in futures]

    def _load(self, i: int) -> None:
        if self.ref is not None:
            ref = self.ref.model_dump(mode="json")
            body = {"method": "load_checkpoint", "kwargs": {"store_root": self.store_root, "ref": ref}}
            got = self._call(i, "POST", "/collective_rpc", body)
            if not got or any(r != self.ref.sha256 for r in got.get("results", [])):
                raise RolloutServerError(
                    f"rollout server {self.urls[i]}: loaded {got}, not {self.ref.sha256}"
                )
        else:
            from rl_core.models.engine_view import engine_folder

            view = str(engine_folder(self.ckpt_dir))  # a tied model as its untied view
            body = {"method": "reload_weights", "kwargs": {"weights_path": view}}
            self._call(i, "POST", "/collective_rpc", body)
        self._call(i, "POST", "/reset_prefix_cache")  # cached prompt KV from the old weights

    def load_weights(
        self, ckpt_dir: str | Path, weights: dict[str, Any] | None = None, ref: ArtifactRef | None = None
    ) -> None:
        """Every server loads the checkpoint: the stored ``ref`` from the store (each fetches and verifies
        it), else the folder ``ckpt_dir`` (``weights`` in memory cannot cross)."""
        self.ckpt_dir = str(ckpt_dir)
        self.ref = ref if ref is not None and ref.stored is not False and self.store_root else None
        for i in range(len(self.urls)):
            self._load(i)

    def stats(self) -> dict[str, float]:
        """Prefix-cache queries, hits and hit rate summed over the servers since the previous call (the
        generate stage calls it once per iteration: the figures are that iteration's). A server's counters
        run from its start, so each call takes the difference from the last counters seen at that URL; a
        server restarted since (a new URL, or counters that went down) counts from zero."""
        totals = {"queries": 0.0, "hits": 0.0}
        for url in self.urls:
            text = self.http.get(url + "/metrics", timeout=10).text
            now = {"queries": 0.0, "hits": 0.0}
            for kind, value in _METRIC.findall(text):
                now[kind] += float(value)
            last = self._counters.get(url, {"queries": 0.0, "hits": 0.0})
            if now["queries"] < last["queries"]:  # restarted at the same URL
                last = {"queries": 0.0, "hits": 0.0}
            for kind in totals:
                totals[kind] += now[kind] - last[kind]
            self._counters[url] = now
        rate = totals["hits"] / totals["queries"] if totals["queries"] else 0.0
        return {
            "prefix_cache_queries": totals["queries"],
            "prefix_cache_hit_rate": rate,
            "server_restarts": self.restarts,
        }

    def close(self) -> None:
        self.http.close()
        if self.on_close is not None:
            self.on_close()
