"""``cerebras.appliance.utils.debug_args``: cerebrax's minimal stand-in for the debug args of
Cerebras' appliance package, present only under the cstorch alias.

Cerebras' ``DebugArgs`` is a protobuf message of settings for its compiler and cluster
servers (``debug_mgr.labels``, ``ini.bools``, ...). Model Zoo reads one from a file
(``get_debug_args(path)``), sets fields by dotted key (``update_debug_args_from_keys``) and
INI values (:mod:`.ini`), writes it back (``write_debug_args``) and merges it into
``cstorch.backends.csx.debug.debug_args`` (``MergeFrom``). cerebrax has neither compiler nor
servers for these settings, so :class:`DebugArgs` only records what is set, as nested
fields, for cerebrax's flags report (``cstorch.backends.csx.debug.debug_args`` is recorded,
not applied).

Files are protobuf text format, read and written without Cerebras' schema: ``name: value``,
``name { ... }`` (``<...>`` too), ``name: [v, ...]``, and map entries
``name { key: K value: V }``. A field given twice becomes a list; the ``ini`` maps, and
maps whose keys are not identifiers, are written as map entries, other nested fields as
messages.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from typing import Any

from cerebrax.backend import DebugArgs

__all__ = ["DebugArgs", "get_debug_args", "update_debug_args_from_keys", "write_debug_args"]

_SCALARS = (bool, int, float, str)
# The INI maps of DebugArgs.ini, by the type of value each holds.
INI_MAPS = {bool: "bools", int: "ints", float: "floats", str: "strings"}
_MAP_FIELDS = {("ini", name) for name in INI_MAPS.values()}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Identifier(str):
    """An unquoted text-format value (an enum value's name): written back unquoted."""


def get_debug_args(path: DebugArgs | str | os.PathLike | None) -> DebugArgs:
    """The debug args in the text-format file ``path``; a new, empty :class:`DebugArgs`
    where ``path`` is None or empty; ``path`` itself where it is a :class:`DebugArgs`.

    Raises:
      ValueError: the file is not protobuf text format (line named).
    """
    if isinstance(path, DebugArgs):
        return path
    args = DebugArgs()
    if path:
        with open(path, encoding="utf-8") as file:
            text = file.read()
        try:
            args.merge(_Parser(text).message())
        except ValueError as error:
            raise ValueError(f"{os.fspath(path)}: {error}") from None
    return args


def write_debug_args(debug_args: DebugArgs, path: str | os.PathLike) -> None:
    """Writes ``debug_args`` to ``path`` in protobuf text format (:func:`get_debug_args`
    reads it back)."""
    lines: list[str] = []
    _write(debug_args.fields, 0, (), lines)
    with open(path, "w", encoding="utf-8") as file:
        file.write("".join(f"{line}\n" for line in lines))


def update_debug_args_from_keys(debug_args: DebugArgs, flat_dargs: Mapping[str, Any]
                                ) -> None:
    """Sets fields of ``debug_args`` from ``flat_dargs``, whose keys are dotted field paths
    (``{"debug_mgr.labels.team": "ml"}``) and whose values may be nested dicts; nested
    fields merge, other values (lists too) replace what was there.

    Raises:
      ValueError: an empty key or path part. TypeError: a value that no field holds.
    """
    nested: dict[str, Any] = {}

    def put(into: dict, key: str, value: Any) -> None:
        parts = key.split(".") if isinstance(key, str) else [key]
        if any(part == "" for part in parts):
            raise ValueError(f"update_debug_args_from_keys: invalid field path {key!r}.")
        for part in parts[:-1]:
            into = into.setdefault(part, {})
            if not isinstance(into, dict):
                raise ValueError(f"update_debug_args_from_keys: {key!r} sets a field inside "
                                 f"{part!r}, which holds a value.")
        if isinstance(value, Mapping):
            target = into.setdefault(parts[-1], {})
            if not isinstance(target, dict):
                target = into[parts[-1]] = {}
            for sub_key, sub_value in value.items():
                put(target, sub_key, sub_value)
        else:
            into[parts[-1]] = DebugArgs.check(value, key)

    for key, value in flat_dargs.items():
        put(nested, key, value)
    debug_args.merge(nested)


# ---------------------------------------------------------------- protobuf text format

def _quote(text: str) -> str:
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\{ord(char):03o}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _scalar(value: Any) -> str:
    if isinstance(value, _Identifier):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return _quote(value)


def _is_map(path: tuple, value: dict) -> bool:
    return path in _MAP_FIELDS or not all(
        isinstance(key, str) and _IDENTIFIER.fullmatch(key) for key in value)


def _write(fields: dict, depth: int, path: tuple, lines: list[str]) -> None:
    pad = "  " * depth
    for name, value in fields.items():
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict):
                lines.append(f"{pad}{name}: {_scalar(item)}")
            elif _is_map((*path, name), item):
                for key, entry in item.items():
                    lines.append(f"{pad}{name} {{")
                    lines.append(f"{pad}  key: {_scalar(key)}")
                    if isinstance(entry, dict):
                        lines.append(f"{pad}  value {{")
                        _write(entry, depth + 2, (), lines)
                        lines.append(f"{pad}  }}")
                    else:
                        lines.append(f"{pad}  value: {_scalar(entry)}")
                    lines.append(f"{pad}}}")
            else:
                lines.append(f"{pad}{name} {{")
                _write(item, depth + 1, (*path, name), lines)
                lines.append(f"{pad}}}")


_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<punct>[{}<>\[\]:,;])
  | (?P<word>[^\s{}<>\[\]:,;"'\#]+)
""", re.VERBOSE)
_ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", "f": b"\f",
            "v": b"\v", "\\": b"\\", "'": b"'", '"': b'"', "?": b"?"}
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{4})|"
                     r"U([0-9A-Fa-f]{8})|(.))", re.DOTALL)
_MAP_ENTRY = object()


def _unquote(token: str) -> str:
    """A quoted text-format string's text (C escapes; octal and hex escapes are bytes of
    the UTF-8 text)."""
    out = bytearray()
    body, last = token[1:-1], 0
    for match in _ESCAPE.finditer(body):
        out += body[last:match.start()].encode()
        octal, hexa, u4, u8, other = match.groups()
        if octal or hexa:
            out.append(int(octal, 8) if octal else int(hexa, 16))
        elif u4 or u8:
            out += chr(int(u4 or u8, 16)).encode()
        elif other in _ESCAPES:
            out += _ESCAPES[other]
        else:
            raise ValueError(f"invalid escape \\{other} in {token}")
        last = match.end()
    out += body[last:].encode()
    return out.decode("utf-8", "replace")


def _word(word: str) -> Any:
    if word in ("true", "True"):
        return True
    if word in ("false", "False"):
        return False
    try:
        return int(word, 16) if word.lstrip("+-").lower().startswith("0x") else int(word)
    except ValueError:
        pass
    try:
        return float(word[:-1] if word[-1:] in "fF" and word.lower() not in (
            "inf", "-inf", "+inf") else word)
    except ValueError:
        return _Identifier(word)


class _Parser:
    """Protobuf text format into nested dicts, without a schema."""

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str, int]] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None:
                raise ValueError(f"line {text.count(chr(10), 0, position) + 1}: cannot read "
                                 f"{text[position:position + 20]!r}")
            if match.lastgroup != "space":
                self.tokens.append((match.lastgroup, match.group(),
                                    text.count("\n", 0, position) + 1))
            position = match.end()
        self.at = 0

    def peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def next_token(self, expected: str = "") -> tuple[str, str, int]:
        if self.at >= len(self.tokens):
            raise ValueError(f"the text ends where {expected or 'more'} was expected")
        token = self.tokens[self.at]
        self.at += 1
        return token

    def error(self, token: tuple[str, str, int], expected: str) -> ValueError:
        return ValueError(f"line {token[2]}: expected {expected}, found {token[1]!r}")

    def message(self, close: str | None = None) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        while self.peek() != close:
            kind, name, line = token = self.next_token(f"a field name or {close!r}")
            if kind != "word" or not _IDENTIFIER.fullmatch(name):
                raise self.error(token, "a field name")
            colon = self.peek() == ":"
            if colon:
                self.next_token()
            if self.peek() == "[" and colon:
                self.next_token()
                values = []
                while self.peek() != "]":
                    values.append(self.value(line))
                    if self.peek() == ",":
                        self.next_token()
                self.next_token()
                for value in values:
                    self.add(fields, name, value, line)
            else:
                self.add(fields, name, self.value(line, scalar=colon), line)
            if self.peek() in (",", ";"):
                self.next_token()
        if close is not None:
            self.next_token()
        return fields

    def value(self, line: int, scalar: bool = True) -> Any:
        token = self.next_token("a value")
        kind, text, _ = token
        if text in ("{", "<"):
            fields = self.message("}" if text == "{" else ">")
            if "key" in fields and set(fields) <= {"key", "value"}:
                return (_MAP_ENTRY, fields["key"], fields.get("value", {}))
            return fields
        if not scalar:
            raise self.error(token, "'{' or ':'")
        if kind == "string":
            parts = [_unquote(text)]
            while self.at < len(self.tokens) and self.tokens[self.at][0] == "string":
                parts.append(_unquote(self.next_token()[1]))  # "a" "b" is "ab"
            return "".join(parts)
        if kind == "word":
            return _word(text)
        raise self.error(token, "a value")

    @staticmethod
    def add(fields: dict, name: str, value: Any, line: int) -> None:
        if isinstance(value, tuple):  # a map entry
            entries = fields.setdefault(name, {})
            if not isinstance(entries, dict):
                raise ValueError(f"line {line}: {name!r} holds both values and map entries")
            entries[value[1]] = value[2]
        elif name not in fields:
            fields[name] = value
        elif isinstance(fields[name], list):
            fields[name].append(value)
        else:
            fields[name] = [fields[name], value]
