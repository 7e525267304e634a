"""Reading overrides and reporting config errors: ``section.field=value`` strings into a config dict, and a
validation error as one message naming every bad field. The schema itself is ``rl_core.schema.config``.

    parse_overrides(["train.lr=3e-5", "task.env_args.digits=[3]"])   # [("train.lr", 3e-05), ...]
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any, get_origin

import yaml
from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field."""


SHOWN_MAX = 200  # characters of a bad value a message repeats (a YAML alias bomb expands to megabytes)


def _shown(value: Any) -> str:
    """``repr(value)``, cut to ``SHOWN_MAX`` characters; nested lists and mappings shown to a few levels and
    items (an alias bomb's value is never expanded in full), an integer too long to print by its size.

    >>> _shown("x" * 500)[-24:]
    'xxxx... (502 characters)'
    >>> len(_shown([[[[[1] * 50] * 50] * 50] * 50])) < 300, _shown(10**5000)
    (True, 'an integer of about 5001 digits')
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3000:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value) if isinstance(value, str | bytes) else _BRIEF.repr(value)
    return text if len(text) <= SHOWN_MAX else f"{text[:SHOWN_MAX]}... ({len(text)} characters)"


_BRIEF = reprlib.Repr()  # Python 3.11's takes no arguments
_BRIEF.maxlevel, _BRIEF.maxlong, _BRIEF.maxstring, _BRIEF.maxother = 4, SHOWN_MAX, SHOWN_MAX, 80
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxdict = _BRIEF.maxset = 6


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per bad field: its dotted name, what is wrong, the allowed values and the value given."""
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        allowed = ""
        ctx = e.get("ctx") or {}
        if "expected" in ctx:
            allowed = f" (allowed: {ctx['expected']})"
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f"; got {_shown(got)}"  # a whole section says nothing new
        said = f"{e['msg'].removeprefix('Value error, ')}{allowed}{shown}"
        lines.append(f"  {loc}: {said}" if loc else f"  {said}")  # the whole config's own check: no field
    return "\n".join(lines)


def set_dotted(root: type[BaseModel], data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in the config dict ``data``, walking ``root``'s sections; unknown fields are refused."""
    parts = key.split(".")
    node = data
    fields: dict[str, Any] = root.model_fields
    model: type[BaseModel] | None = root
    for i, part in enumerate(parts):
        if model is dict:  # a free mapping (task.env_args, reward.weights): any key, checked by its owner
            if i == len(parts) - 1:
                node[part] = value
                return
            raise ConfigError(f"config field {'.'.join(parts[: i + 1])!r} is not a section")
        if model is None or part not in fields:
            known = ", ".join(sorted(fields)) if model is not None else "(none: not a section)"
            raise ConfigError(f"unknown config field {'.'.join(parts[: i + 1])!r}; known here: {known}")
        if i == len(parts) - 1:
            node[part] = value
            return
        ann = fields[part].annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if model is None and get_origin(ann) is dict:
            # one key of a mapping: the others keep their defaults (reward.weights.partial=0.5 adds a term)
            node.setdefault(part, dict(fields[part].get_default(call_default_factory=True)))
            model = dict  # type: ignore[assignment]
        fields = model.model_fields if model is not None and model is not dict else {}
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config field {'.'.join(parts[: i + 1])!r} is not a section")


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """Parse ``a.b=value`` strings; values are YAML scalars or lists (``[1,2]``)."""
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except (ValueError, RecursionError) as e:  # past Python's digit limit or nesting depth
            raise ConfigError(f"override {_shown(item)}: its value cannot be read ({str(e)[:120]})") from e
        except yaml.YAMLError as e:
            problem = " ".join(str(getattr(e, "problem", None) or e).split())
            raise ConfigError(f"override {_shown(item)}: its value is not valid YAML ({problem})") from e
        out.append((key.strip(), value))
    return out


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (a second ``train:`` section would
    otherwise replace the first without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: its keys may be set again here
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's sections; every way it cannot be read is a ``ConfigError`` naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError(f"config file not found: {path}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} cannot be read as UTF-8 text: {e}") from e
    try:
        data = yaml.load(text, Loader=_UniqueKeys)  # noqa: S506  (a SafeLoader subclass)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from e
    except (ValueError, RecursionError) as e:  # a number past Python's digit limit, nesting past its depth
        raise ConfigError(f"config file {path} cannot be read: {str(e)[:160]}") from e
    if data is None:  # an empty file (or only comments): the defaults
        return {}
    if not isinstance(data, dict):  # a list, a scalar, and false or 0 too (they are not "empty")
        raise ConfigError(f"config file {path} must hold a mapping of sections, not {_shown(data)}")
    return data
