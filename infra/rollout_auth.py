"""What a rollout server adds to vLLM's API server (``infra/rollout_servers.py`` passes both):

- ``TokenAuth`` (``--middleware infra.rollout_auth.TokenAuth``): every route but ``/health`` needs
  ``Authorization: Bearer <token>``, the token in the server's ``RLFOUNDRY_SERVER_TOKEN``. vLLM's own
  ``--api-key`` guards only ``/v1/...``; its development routes — ``/collective_rpc`` (calls any worker
  method), ``/reset_prefix_cache``, ``/sleep`` — and ``/metrics`` stay open, so this guards everything. A
  server started without a token refuses every guarded request (it never runs open).
- ``StoreCheckpointLoader`` (``--worker-extension-cls infra.rollout_auth.StoreCheckpointLoader``): the
  worker method ``load_checkpoint(store_root, ref)`` that the weight sync calls: the server fetches the
  committed checkpoint from the store itself (``rl_core.artifacts.store.Store.local_dir``: every file's sha256
  checked against the reference, into the server's own cache), then reloads its weights from that folder. So a
  server that shares nothing with the flow but the store (a pod, its own mount namespace, an empty cache)
  takes every new policy; and the flow's path is never what it reads.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

TOKEN_ENV = "RLFOUNDRY_SERVER_TOKEN"
OPEN_PATHS = frozenset({"/health"})


class TokenAuth:
    """Pure ASGI middleware: a bearer token on every request but the open paths."""

    def __init__(self, app: Any) -> None:
        self.app = app
        token = os.environ.get(TOKEN_ENV, "")
        self.digest = hashlib.sha256(token.encode()).digest() if token else None

    def _allowed(self, scope: dict[str, Any]) -> bool:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN_PATHS:
            return True
        if self.digest is None:
            return False
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, value = header.partition(" ")
        given = hashlib.sha256(value.encode()).digest()
        return scheme.lower() == "bearer" and hmac.compare_digest(given, self.digest)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": "unauthorized: this rollout server takes requests from its run only"})
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
            }
        )
        await send({"type": "http.response.body", "body": body.encode()})


class StoreCheckpointLoader:
    """Mixed into vLLM's worker class; its methods are reachable through ``/collective_rpc``."""

    def load_checkpoint(self, store_root: str, ref: dict[str, Any]) -> str:
        """Fetch checkpoint ``ref`` (an ``ArtifactRef`` as JSON) from the store at ``store_root``, verified,
        and load it; returns the digest of the weights now served."""
        from rl_core.artifacts.manifest import ArtifactRef
        from rl_core.artifacts.paths import cache_dir
        from rl_core.artifacts.store import Store
        from rl_core.models.engine_view import engine_folder

        checkpoint = ArtifactRef.model_validate(ref)
        local = Store(store_root).local_dir(checkpoint, cache_dir("server-checkpoints"))
        # a tied model as its untied view: vLLM's reload does not re-tie (rl_core.models.engine_view)
        self.reload_weights(weights_path=str(engine_folder(local)))  # type: ignore[attr-defined]
        return checkpoint.sha256
