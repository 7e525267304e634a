"""No credentials in a config: it is logged whole (MLflow's parameters, the run record ``run.json``, the
Prefect flow run's parameters, the HTML report), so a password in any of its URLs would be stored and shown in
all of them. Credentials come from the environment: ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``
for an MLflow server, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` for S3.
"""

from __future__ import annotations

from typing import Any, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, model_validator


def with_credentials(value: Any, where: str = "") -> list[str]:
    """The dotted fields of ``value`` (a config's data) holding a URL with credentials in it (``user:pass@``).

    >>> with_credentials({"tracking": {"mlflow_uri": "http://alice:s3cret@host:5000"}, "store": {"uri": "x"}})
    ['tracking.mlflow_uri']
    >>> with_credentials({"rollout": {"server_urls": ["http://127.0.0.1:8000", "https://k@h/v1"]}})
    ['rollout.server_urls[1]']
    """
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in with_credentials(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, list | tuple):
        return [f for i, v in enumerate(value) for f in with_credentials(v, f"{where}[{i}]")]
    if isinstance(value, str) and "@" in value and "://" in value:
        try:
            parts = urlsplit(value.strip())
        except ValueError:
            return []
        # a password; or a bare user name where HTTP carries it (a token as the user: https://TOKEN@host)
        if parts.password or (parts.username and parts.scheme.lower() in ("http", "https", "ws", "wss")):
            return [where]
    return []


class NoCredentials(BaseModel):
    """The whole config's check (a base of ``Config``): a URL with credentials is an error naming its field
    (its value is never repeated)."""

    @model_validator(mode="after")
    def _no_credentials(self) -> Self:
        found = with_credentials(self.model_dump(mode="json"))
        if found:
            raise ValueError(
                f"{', '.join(found)}: a URL with credentials in it (user:password@); the config is logged "
                "whole (MLflow, run.json, Prefect, the report): give them in the environment instead "
                "(MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD for MLflow, AWS_* for S3)"
            )
        return self


def redacted(url: str) -> str:
    """``url`` without its credentials, for messages.

    >>> redacted("http://minio:s3cret@127.0.0.1:9000/x")
    'http://***@127.0.0.1:9000/x'
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a malformed URL>"
    if not (parts.username or parts.password):
        return url
    return parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]).geturl()
