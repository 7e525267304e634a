"""The dataset environment's rows (``envs/dataset.py``): a file's rows (JSON Lines, JSON, Parquet, a
``save_to_disk`` shard), and a row's fields as a task's prompt and answer. Bad input is a ``ValueError``
naming the file, the row (and a JSON Lines file's line) and the field."""

from __future__ import annotations

import io
import json
import math
from decimal import Decimal
from typing import Any

_ROLES = ("system", "user", "assistant")


# -- files -----------------------------------------------------------------------------------------------
def file_rows(data: bytes, path: str, name: str) -> list[tuple[Any, int | None]]:
    """(row, its line in the file or None) of one file's bytes, by the file's extension: ``.jsonl`` one JSON
    value a line; ``.json`` a list of rows, or JSON Lines (what ``datasets.Dataset.to_json`` writes);
    ``.parquet``; ``.arrow`` (a ``save_to_disk`` shard). A UTF-8 byte-order mark is allowed."""
    if path.endswith(".jsonl"):
        return _json_lines(_utf8(data, name), name)
    if path.endswith(".json"):
        text = _utf8(data, name)
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # more than one value: JSON Lines
                raise ValueError(f"task.env_args: {name}: not JSON ({e.msg}, line {e.lineno})") from None
            return _json_lines(text, name)
        except (ValueError, RecursionError) as e:  # past Python's digit limit or nesting depth
            raise ValueError(f"task.env_args: {name}: cannot be read ({str(e)[:120]})") from None
        if isinstance(rows, dict):  # one object: JSON Lines of one row (Dataset.to_json of a single row)
            return [(rows, 1)]
        if not isinstance(rows, list):
            raise ValueError(f"task.env_args: {name}: expected a JSON list of rows, or JSON Lines")
        return [(row, None) for row in rows]
    if path.endswith((".parquet", ".arrow")):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            if path.endswith(".parquet"):
                table = pq.read_table(io.BytesIO(data))
            else:  # a save_to_disk shard: an Arrow IPC stream
                table = pa.ipc.open_stream(io.BytesIO(data)).read_all()
        except (pa.ArrowInvalid, OSError) as e:
            raise ValueError(f"task.env_args: {name}: unreadable ({e})") from None
        return [(row, None) for row in table.to_pylist()]
    raise ValueError(f"task.env_args: {name}: not a .jsonl, .json, .parquet file or save_to_disk folder")


def _utf8(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"task.env_args: {name}: not UTF-8 text (byte {e.start})") from None


def _json_lines(text: str, name: str) -> list[tuple[Any, int | None]]:
    """One JSON value per ``\\n``-ended line (a ``\\r`` before it dropped), blank lines skipped. Only ``\\n``
    ends a line: U+2028 or NEL inside a JSON string (``json.dumps(ensure_ascii=False)`` writes them raw) is
    text, not a line break as ``str.splitlines`` would have it."""
    rows: list[tuple[Any, int | None]] = []
    for n, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip():
            try:
                rows.append((json.loads(line), n))
            except json.JSONDecodeError as e:
                raise ValueError(f"task.env_args: {name}: line {n} is not JSON ({e.msg})") from None
            except (ValueError, RecursionError) as e:  # past Python's digit limit or nesting depth
                raise ValueError(f"task.env_args: {name}: line {n} cannot be read ({str(e)[:120]})") from None
    return rows


# -- fields ----------------------------------------------------------------------------------------------
def field(row: dict[str, Any], dotted: str, name: str, i: int) -> Any:
    """The row's field ``dotted``: a key as it is first (``Dataset.flatten()`` names a column
    ``reward_model.ground_truth``), else a path of nested keys (verl's ``reward_model`` ->
    ``ground_truth``)."""
    found = _lookup(row, dotted.split("."))
    if found is _NULL:
        raise ValueError(f"task.env_args: {name}: row {i} field {dotted!r} is null (no value)")
    if found is _MISSING:
        raise ValueError(f"task.env_args: {name}: row {i} has no field {dotted!r}")
    return found


_MISSING, _NULL = object(), object()  # no such field; the field is there and null


def _lookup(value: Any, parts: list[str]) -> Any:
    """The value at ``parts``, the longest literal key first; ``_NULL`` when only a null is found there."""
    if not parts:
        return _NULL if value is None else value
    if not isinstance(value, dict):
        return _MISSING
    null = False
    for k in range(len(parts), 0, -1):
        key = ".".join(parts[:k])
        if key in value:
            found = _lookup(value[key], parts[k:])
            if found is _NULL:
                null = True
            elif found is not _MISSING:
                return found
    return _NULL if null else _MISSING


def prompt(value: Any, name: str, i: int, field: str) -> str | list[dict[str, str]]:
    """The prompt field: a non-empty text, or chat messages that end with the user's turn (an SFT
    ``messages`` column ends with the assistant's answer: refused, not shown to the policy)."""
    where = f"task.env_args: {name}: row {i} field {field!r}"
    if isinstance(value, str) and value.strip():
        return text(value, where)
    if (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value
        )
    ):
        roles = [m["role"] for m in value]
        if any(r not in _ROLES for r in roles) or "user" not in roles:
            raise ValueError(f"{where}: chat messages need a user turn and roles among {_ROLES}, not {roles}")
        if roles[-1] != "user":
            raise ValueError(
                f"{where}: the last chat message is the {roles[-1]}'s, not the user's (roles {roles}); the "
                "prompt must end with the user's turn (an SFT messages column ends with the answer: drop "
                "its last turn)"
            )
        if any(not m["content"].strip() for m in value):
            raise ValueError(f"{where}: a chat message has empty content")
        return [{"role": m["role"], "content": text(m["content"], where)} for m in value]
    raise ValueError(f"{where} is neither a text nor chat messages [{{role, content}}]")


def text(value: str, where: str) -> str:
    """``value`` if it is valid Unicode text (a lone surrogate cannot be stored or tokenized)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where}: not valid Unicode text ({e.reason} at character {e.start})") from None
    return value


def answer(value: Any, where: str) -> str:
    """The answer field as the text the verifier compares: a text as it is (stripped); a finite number in
    plain positional notation, integral ones as integers (a float64 column's ``18.0`` is ``18``, ``1e20`` is
    ``100000000000000000000``, ``1e-07`` is ``0.0000001``). A boolean, NaN, infinity, a list or an object is
    refused rather than compared as its Python spelling (``True``, ``['Paris']``).

    >>> answer(18.0, "f"), answer(1e20, "f"), answer(-0.0, "f"), answer(2.5e-7, "f"), answer(7, "f")
    ('18', '100000000000000000000', '0', '0.00000025', '7')
    """
    if isinstance(value, bool):
        raise ValueError(
            f"{where} is a boolean ({value}), not a text or a number: write the answer as the text to compare"
        )
    if isinstance(value, list | tuple):
        raise ValueError(
            f"{where} is a list, not a text or a number: a list of alternative answers is not supported; "
            "write the gold answer as one text (a set or tuple in its own form, e.g. \\{1, 2\\})"
        )
    if isinstance(value, float | Decimal):
        if not (value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)):
            raise ValueError(f"{where} is {value}, not a number")
        return _plain(Decimal(repr(value)) if isinstance(value, float) else value)
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{where} is a {type(value).__name__}, not a text or a number")
    return text(value.strip(), where)


def _plain(d: Decimal) -> str:
    """A finite decimal in positional notation, without trailing zeros (exact: no rounding context)."""
    s = format(d, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s
