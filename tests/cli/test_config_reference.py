"""The config-key reference of the `cerebrax` command, checked against its schema.

The keys are found by walking the schema's pydantic models here (not from a list), so a
key added to the schema without a description fails these tests.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo

from cerebrax._cli import _schema
from cerebrax._cli._reference import (LAYOUTS, Layout, anchor, config_reference_markdown,
                                      undocumented_keys)


# ---- walking the schema (independently of the generator) --------------------------------
def _nested(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The section model inside ``annotation``, and whether it is a list of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    for arg in typing.get_args(annotation):
        model, is_list = _nested(arg)
        if model is not None:
            return model, is_list or origin is list
    return None, False


def _keys(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """``(dotted path, field)`` of every key under ``model``, nested sections included."""
    for name, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or name}" if prefix else field.alias or name
        yield path, field
        inner, is_list = _nested(field.annotation)
        if inner is not None:
            yield from _keys(inner, path + "[]" if is_list else path)


def _sections(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, type]]:
    """``(dotted path, model)`` of every nested section under ``model``."""
    for path, field in _keys(model, prefix):
        inner, is_list = _nested(field.annotation)
        if inner is not None:
            yield path + "[]" if is_list else path, inner


ALL_KEYS = [key for layout in LAYOUTS for key in _keys(layout.model)]
ALL_SECTIONS = [s for layout in LAYOUTS for s in _sections(layout.model)]


def _marker(annotation: Any, kind: type) -> Any:
    """The first ``kind`` object in the metadata of ``annotation``'s Annotated parts."""
    if typing.get_origin(annotation) is Annotated:
        for item in annotation.__metadata__:
            if isinstance(item, kind):
                return item
    for arg in typing.get_args(annotation):
        found = _marker(arg, kind)
        if found is not None:
            return found
    return None


def _field_marker(field: FieldInfo, kind: type) -> Any:
    found = [m for m in field.metadata if isinstance(m, kind)]
    return found[0] if found else _marker(field.annotation, kind)


def _entry(markdown: str, path: str) -> str:
    """The text of ``path``'s entry: from its term line to the next term or heading."""
    start = markdown.index(f"\n`{path}`\n") + 1
    ends = [markdown.find(mark, start + 1) for mark in ("\n`", "\n#", "\n(")]
    return markdown[start:min([e for e in ends if e != -1] or [len(markdown)])]


@pytest.fixture(scope="module")
def markdown() -> str:
    return config_reference_markdown()


# ---- every key is described ------------------------------------------------------------
def test_the_walk_finds_both_layouts_keys() -> None:
    paths = [path for path, _ in ALL_KEYS]
    assert "runconfig.num_steps" in paths and "trainer.init.loop.num_steps" in paths
    assert "trainer.validate.val_dataloader.input_fn" in paths  # the alias, not validate_
    assert "metrics[].type" in paths and "runconfig.num_csx" in paths  # ClusterConfig's


@pytest.mark.parametrize("path", [path for path, _ in ALL_KEYS])
def test_every_key_has_a_description(path: str) -> None:
    field = dict(ALL_KEYS)[path]
    assert field.description and field.description.strip(), f"{path} has no description"


def test_undocumented_keys_is_empty() -> None:
    assert undocumented_keys() == []


def test_refused_keys_say_why() -> None:
    refused = [(path, field, _field_marker(field, _schema.Refused)) for path, field in ALL_KEYS]
    refused = [(path, field, marker) for path, field, marker in refused if marker is not None]
    assert len(refused) >= 5
    for path, field, marker in refused:
        assert "Refused" in field.description and marker.reason in field.description, path


def test_sections_with_other_keys_say_what_they_are(markdown: str) -> None:
    open_sections = [(path, model) for path, model in ALL_SECTIONS
                     if model.model_config.get("extra") == "allow"]
    assert {"model", "train_input", "optimizer", "metrics[]"} <= {p for p, _ in open_sections}
    for path, _ in open_sections:
        assert "Other keys" in _entry(markdown, f"{path}.*"), path


# ---- the page ----------------------------------------------------------------------------
@pytest.mark.parametrize("path", [path for path, _ in ALL_KEYS])
def test_every_key_is_on_the_page(markdown: str, path: str) -> None:
    description = dict(ALL_KEYS)[path].description
    assert " ".join(description.split()) in " ".join(_entry(markdown, path).split())


def test_every_section_has_a_heading_and_an_anchor(markdown: str) -> None:
    for path, _ in ALL_SECTIONS:
        assert f"({anchor(path)})=\n#" in markdown, path
        assert f"`{path}`" in markdown.split(f"({anchor(path)})=\n", 1)[1].split("\n", 1)[0]
    assert not markdown.startswith("# ") and "\n# " not in markdown  # the page has the title


def test_a_keys_type_and_default_are_in_its_entry(markdown: str) -> None:
    def scalar_with_type(kind: type) -> tuple[str, FieldInfo, str]:
        for path, field in ALL_KEYS:
            expected = _field_marker(field, _schema.Expected)
            if expected and type(field.default) is kind and field.default is not None:
                return path, field, expected.text
        raise AssertionError(f"no key with a {kind.__name__} default and an expected text")

    for kind in (int, str):
        path, field, expected = scalar_with_type(kind)
        entry = _entry(markdown, path)
        assert expected in entry, (path, entry)
        assert f"default `{field.default}`" in entry, (path, entry)
    assert "required" in _entry(markdown, "model")
    assert "required" in _entry(markdown, "optimizer.optimizer_type")


def test_the_page_is_deterministic(markdown: str) -> None:
    assert config_reference_markdown() == markdown


# ---- a key without a description is caught -------------------------------------------
def _layout_with(section: type[BaseModel]) -> Layout:
    root = create_model("Root", __base__=_schema.Section, __doc__="A test layout.",
                        loop=(section, Field(section(), description="The loop.")))
    return Layout("test", "A test layout", root)


def test_a_key_without_a_description_is_reported_and_refused() -> None:
    loop = create_model("Loop", __base__=_schema.LoopV2, surprise=(_schema.Count | None, None))
    layout = _layout_with(loop)
    assert undocumented_keys([layout]) == ["loop.surprise"]
    with pytest.raises(ValueError, match=r"loop\.surprise"):
        config_reference_markdown([layout])
    documented = create_model("Loop", __base__=_schema.LoopV2,
                              surprise=(_schema.Count | None, Field(None, description="New.")))
    assert undocumented_keys([_layout_with(documented)]) == []
    assert "\n`loop.surprise`\n" in config_reference_markdown([_layout_with(documented)])


def test_other_keys_without_a_description_are_reported() -> None:
    class Open(_schema.Arguments):
        """A section with no word on its other keys."""

        fn: _schema.ImportPath = Field(description="The function.")

    layout = Layout("test", "A test layout", create_model(
        "Root", __base__=_schema.Section, open=(Open, Field(description="Open."))))
    assert undocumented_keys([layout]) == ["open.*"]
    with pytest.raises(ValueError, match=r"open\.\*"):
        config_reference_markdown([layout])
