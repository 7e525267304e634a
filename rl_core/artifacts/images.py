"""The images an episode saw, stored once each by content: ``<run>/images/<sha256>.png`` in the run's store,
and the rollout table keeps each turn's digests (``images``: a list per turn, the prompt's first). An image
shown to many episodes (the n samples of a prompt, a page every episode starts from) is written once; a
replayed stage compares the digests, which are in the table's bytes.

    digests = put_images(store, store.run_uri("r1"), [png_a, png_b])   # ["3f1c...", "9a0b..."]
    load_images(store, store.run_uri("r1"), digests)                    # [png_a, png_b], each checked
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any


def digest(data: bytes) -> str:
    """The image's content address: the sha256 of its encoded bytes."""
    return hashlib.sha256(data).hexdigest()


def image_uri(run_uri: str, sha: str) -> str:
    return f"{run_uri}/images/{sha}.png"


def put_images(store: Any, run_uri: str, images: Iterable[bytes]) -> list[str]:
    """Each image's digest, the image written under it unless the store already holds it (the same bytes:
    content-addressed, so nothing stored is ever overwritten with other bytes)."""
    out = []
    for data in images:
        sha = digest(data)
        uri = image_uri(run_uri, sha)
        if not store.exists(uri):
            store.write_bytes(uri, data)
        out.append(sha)
    return out


def load_images(store: Any, run_uri: str, digests: Sequence[str]) -> list[bytes]:
    """The images of ``digests``, each checked against its digest: a missing or altered file is an error
    naming it."""
    out = []
    for sha in digests:
        uri = image_uri(run_uri, str(sha))
        data = store.read_bytes_if_any(uri)
        if data is None:
            raise ValueError(f"image {uri} is missing from the store (a rollout row names it)")
        if digest(data) != sha:
            raise ValueError(
                f"image {uri} is corrupt: its bytes hash to {digest(data)[:12]}..., not {sha[:12]}..."
            )
        out.append(data)
    return out


def row_images(store: Any, run_uri: str, turns: Sequence[Sequence[str]]) -> tuple[bytes, ...]:
    """A rollout row's images in the order its sequence shows them (``images``: digests per turn)."""
    return tuple(load_images(store, run_uri, [d for turn in turns for d in turn]))
