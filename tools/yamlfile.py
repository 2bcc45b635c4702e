"""User YAML files (playbooks, scenarios): a built-in name or a path to a file, the file to a mapping,
and a validation error to the field it names; every problem raised as the caller's ``UsageError``
kind, naming the file, the line or field, and a fix."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .errors import FileError


def load_yaml_mapping(text: str, file: str, error: type[FileError], example: str) -> dict[str, Any]:
    """YAML text -> a mapping (its values are whatever the file holds), or ``error`` naming the file and
    the line."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise error(f"not valid YAML: {getattr(exc, 'problem', exc)}", file=file,
                    field=f"line {mark.line + 1}" if mark else "") from exc
    if not isinstance(data, dict):
        raise error(f"the file must hold a mapping ({example})", file=file)
    return data


def describe_validation(exc: ValidationError) -> tuple[str, str]:
    """A pydantic ValidationError's first problem as (field path, message) for a user-facing error."""
    e = exc.errors()[0]
    loc = ".".join(str(x) for x in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        msg = f"unknown key `{e['loc'][-1]}`"
    return loc, msg


def resolve_yaml_ref(ref: str, folder: Path, error: type[FileError], what: str,
                     list_cmd: str) -> Path:
    """A path to a ``.yaml`` file, or the name of a built-in one in ``folder``; ``error`` names what is wrong."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        p = Path(ref)
        if not p.is_file():
            raise error("no such file", file=ref, fix=f"give a path to a {what} .yaml, or a built-in name (`{list_cmd}`)")
        return p
    p = folder / f"{ref}.yaml"
    if not p.is_file():
        close = difflib.get_close_matches(ref, sorted(x.stem for x in folder.glob("*.yaml")), n=1)
        hint = f"did you mean `{close[0]}`? " if close else ""
        raise error(f"no built-in {what} of that name", file=ref, fix=f"{hint}`{list_cmd}` names them all")
    return p


def line_of(text: str, loc: tuple[Any, ...] | list[Any]) -> int | None:
    """The 1-based line of the YAML node at ``loc`` (a pydantic error's path: keys and list indexes), or of
    the deepest node of it that exists (a missing key is reported at its parent); None where the text does
    not parse."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    if node is None:
        return None
    line = node.start_mark.line + 1
    for key in loc:
        nxt = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if str(k.value) == str(key):
                    nxt, line = v, k.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and 0 <= key < len(node.value):
            nxt = node.value[key]
            line = nxt.start_mark.line + 1
        if nxt is None:
            break
        node = nxt
    return line
