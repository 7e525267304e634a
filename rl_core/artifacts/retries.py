"""Calls to a remote store (S3) retried with exponential backoff while the endpoint is unreachable; then a
``StoreUnavailable`` names the endpoint (rl_core.artifacts.store)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar

import tenacity


class StoreUnavailable(RuntimeError):
    """The object store did not answer after every retry; the message names the endpoint."""


T = TypeVar("T")
log = logging.getLogger("rlfoundry.store")


def transient(exc: BaseException) -> bool:
    """A failure worth retrying: the endpoint is unreachable, timed out or answered 5xx."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ConnectionError | TimeoutError):
            return True
        mod = type(e).__module__
        name = type(e).__name__
        if mod.startswith(("botocore", "aiohttp")) and (
            "Connect" in name or "Timeout" in name or name in ("HTTPClientError", "ServerDisconnectedError")
        ):
            return True
        status = getattr(e, "response", None)
        if isinstance(status, dict) and status.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500:
            return True
        e = e.__cause__ or e.__context__
    return False


def s3_endpoint() -> str:
    """The S3 endpoint, as messages name it (without credentials, were any in its URL)."""
    from rl_core.schema.config_secrets import redacted

    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return redacted(url) if url else "the default AWS S3 endpoint"


# No retry starts after this long: an endpoint that accepts connections and never answers costs a read
# timeout (60 s) per attempt, six attempts ~6 minutes before; now ~2.
MAX_TOTAL_S = 90.0


def with_retries(
    fn: Callable[[], T], *, what: str, attempts: int, max_wait_s: float, max_total_s: float = MAX_TOTAL_S
) -> T:
    """Call ``fn`` until it succeeds, or ``attempts`` transient failures have passed, or no retry may start
    within ``max_total_s`` of the first call (backoff 0.5 s doubling up to ``max_wait_s``); then raise
    StoreUnavailable naming the endpoint. Other errors pass through."""
    try:
        for attempt in tenacity.Retrying(
            stop=tenacity.stop_after_attempt(attempts) | tenacity.stop_after_delay(max_total_s),
            wait=tenacity.wait_exponential(multiplier=0.5, max=max_wait_s),
            retry=tenacity.retry_if_exception(transient),
            before_sleep=lambda rs: log.warning(
                "S3 endpoint %s: %s failed (attempt %d/%d), retrying",
                s3_endpoint(),
                what,
                rs.attempt_number,
                attempts,
            ),
        ):
            with attempt:
                return fn()
    except tenacity.RetryError as e:
        last = e.last_attempt.exception()
        raise StoreUnavailable(
            f"S3 endpoint {s3_endpoint()} unreachable: {what} failed {e.last_attempt.attempt_number} times "
            f"({type(last).__name__}: {last})"
        ) from last
    raise AssertionError("unreachable")
