"""The reference of every key of the `cerebrax` command's config, generated from its schema.

:func:`config_reference_markdown` walks the pydantic models of :mod:`._schema` (their
``model_fields``, and the section models their annotations hold), so the page lists
exactly the keys the command validates: each with the type its error message names (the
schema's :class:`._schema.Expected` text), its default and its ``Field`` description.
A section that takes other keys (the arguments of a user function) describes them in a
paragraph of its class docstring that starts with "Other keys". A key or section left
undescribed is an error (:func:`undocumented_keys` lists them), so the page cannot lag
behind the schema. The docs build writes it to ``docs/_generated/config_keys.md``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ._schema import ConfigV1, ConfigV2, Expected, Refused

__all__ = ["LAYOUTS", "Layout", "anchor", "config_reference_markdown", "undocumented_keys"]

OTHER_KEYS = "Other keys"  # how a section's docstring paragraph on its extra keys starts


@dataclasses.dataclass(frozen=True)
class Layout:
    """A config layout: its root ``model``, the ``title`` of its part of the page, and
    ``name``, its anchor (``config-<name>``). The root's docstring introduces it."""

    name: str
    title: str
    model: type[BaseModel]


LAYOUTS = (
    Layout("sectioned-layout", "The sectioned layout", ConfigV1),
    Layout("trainer-layout", "The `trainer:` layout", ConfigV2),
)


@dataclasses.dataclass(frozen=True)
class _Key:
    path: str
    field: FieldInfo
    section: str | None  # the path of the section it holds, if it holds one


@dataclasses.dataclass(frozen=True)
class _Section:
    path: str  # "" for a layout's root
    model: type[BaseModel]
    description: str | None  # the description of the key that holds it
    keys: tuple[_Key, ...]


# ---- walking the schema ----------------------------------------------------------------
def _nested(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section model an annotation holds (None: a plain value), and whether the key
    is a list of such sections."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    for arg in typing.get_args(annotation):
        model, is_list = _nested(arg)
        if model is not None:
            return model, is_list or origin is list
    return None, False


def _sections(model: type[BaseModel], path: str = "",
              description: str | None = None) -> Iterator[_Section]:
    """The section ``model`` at ``path``, then the sections under it, in key order."""
    keys, nested = [], []
    for name, field in model.model_fields.items():
        key_path = _join(path, field.alias or name)
        inner, is_list = _nested(field.annotation)
        section = key_path + "[]" if is_list else key_path
        keys.append(_Key(key_path, field, section if inner is not None else None))
        if inner is not None:
            nested.append((inner, section, field.description))
    yield _Section(path, model, description, tuple(keys))
    for inner, section, text in nested:
        yield from _sections(inner, section, text)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _other_keys(model: type[BaseModel]) -> str | None:
    """The docstring paragraph on the other keys of a section that allows them."""
    for paragraph in (inspect.getdoc(model) or "").split("\n\n"):
        if paragraph.startswith(OTHER_KEYS):
            return " ".join(paragraph.split())
    return None


def _takes_other_keys(model: type[BaseModel]) -> bool:
    return model.model_config.get("extra") == "allow"


def undocumented_keys(layouts: Sequence[Layout] = LAYOUTS) -> list[str]:
    """The dotted paths of the keys without a description, in the order of the schema;
    ``<section>.*`` for a section that takes other keys its docstring does not describe."""
    missing = []
    for layout in layouts:
        for section in _sections(layout.model):
            missing += [key.path for key in section.keys
                        if not (key.field.description or "").strip()]
            if _takes_other_keys(section.model) and _other_keys(section.model) is None:
                missing.append(_join(section.path, "*"))
    return missing


# ---- the page ----------------------------------------------------------------------------
def anchor(path: str) -> str:
    """The MyST target of the section (or layout) ``path``: ``config-trainer-init-loop``."""
    return "config-" + re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def config_reference_markdown(layouts: Sequence[Layout] = LAYOUTS) -> str:
    """Every key of ``layouts`` as a MyST Markdown page body (its headings start at
    ``###``: the page that includes it has the title and a ``##`` heading).

    Raises:
      ValueError: a key (or a section's other keys) has no description; the message
        names each key path.
    """
    missing = undocumented_keys(layouts)
    if missing:
        raise ValueError("config keys without a description (a key's Field(description=...), "
                         "or the 'Other keys' paragraph of a section's docstring, in "
                         f"cerebrax/_cli/_schema.py): {', '.join(missing)}")
    blocks, anchors = [], set()
    for layout in layouts:
        for section in _sections(layout.model):
            target = anchor(section.path or layout.name)
            if target in anchors:
                raise ValueError(f"two sections have the anchor {target}")
            anchors.add(target)
            blocks.append(_heading(section, layout, target))
            blocks += [_entry(key) for key in section.keys]
            if _takes_other_keys(section.model):
                other = _markdown(_other_keys(section.model))
                blocks.append(f"`{_join(section.path, '*')}`\n: {other}")
    return "\n\n".join(blocks) + "\n"


def _heading(section: _Section, layout: Layout, target: str) -> str:
    if not section.path:
        intro = _markdown(inspect.getdoc(layout.model) or "")
        return f"({target})=\n### {layout.title}\n\n{intro}".rstrip()
    return f"({target})=\n#### `{section.path}`\n\n{section.description}"


def _entry(key: _Key) -> str:
    """A definition-list item: the key path, its type and default, its description."""
    field = key.field
    if _marker(field, Refused) is not None:
        summary = "refused: any value is an error"
    else:
        summary = _expected(field, key)
        if key.section is not None:
            summary += f", see {{ref}}`{key.section} <{anchor(key.section)}>`"
        summary += f"; {_default(field)}"
    return f"`{key.path}`\n: {summary}\n\n  {field.description.strip()}"


def _expected(field: FieldInfo, key: _Key) -> str:
    """What the key's value must be, as the command's error message says it."""
    expected = _marker(field, Expected)
    if expected is not None:
        return expected.text
    return "a mapping" if key.section is not None else "any value"


def _marker(field: FieldInfo, kind: type) -> Any:
    """The first ``kind`` object among ``field``'s metadata (Optional's parts included)."""
    found = [item for item in field.metadata if isinstance(item, kind)]
    return found[0] if found else _annotated_marker(field.annotation, kind)


def _annotated_marker(annotation: Any, kind: type) -> Any:
    if typing.get_origin(annotation) is Annotated:
        for item in annotation.__metadata__:
            if isinstance(item, kind):
                return item
    for arg in typing.get_args(annotation):
        found = _annotated_marker(arg, kind)
        if found is not None:
            return found
    return None


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "optional"
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_unset=True)
    return f"default `{_yaml(value)}`"


def _yaml(value: Any) -> str:
    """``value`` as a YAML flow scalar, list or mapping (as a config would write it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _markdown(text: str) -> str:
    """reStructuredText literals and roles of a docstring as Markdown code spans."""
    text = re.sub(r":[a-z]+:`~?\.*([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")
