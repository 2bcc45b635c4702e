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

# libyaml's parser where PyYAML was built with it (several times faster on a playbook); a file it refuses is read
# again by PyYAML's own parser, so an error names the same problem and line either way
_FAST = getattr(yaml, "CSafeLoader", None)


def _load(text: str) -> Any:
    if _FAST is not None:
        try:
            return yaml.load(text, Loader=_FAST)  # noqa: S506 - the safe loader, in C
        except yaml.YAMLError:
            pass
    return yaml.safe_load(text)


def load_yaml_mapping(text: str, file: str, error: type[FileError], example: str) -> dict[str, Any]:
    """YAML text -> a mapping (its values are whatever the file holds), or ``error`` naming the file and
    the line."""
    try:
        data = _load(text)
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


MOST_BYTES = 64 << 20   # a user's file larger than this is not a playbook, a scenario or a snapshot


def file_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be read as a user's text file, or None: missing, a folder, not a regular file (a FIFO,
    a device: never opened, so a FIFO cannot block), unreadable, too large. Read with ``read_text_file``."""
    import os
    import stat
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(
            st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file"
        return f"is {kind}, not a regular file"
    if st.st_size > MOST_BYTES:
        return f"is {st.st_size >> 20} MiB: larger than any such file ({MOST_BYTES >> 20} MiB at most)"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return None


def read_text_file(path: str | Path) -> tuple[str | None, str | None]:
    """(the file's text, None), or (None, why not): ``file_problem``'s reasons, or bytes that are not UTF-8."""
    why = file_problem(path)
    if why:
        return None, why
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"is not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x}): a binary file?"


def read_yaml_file(path: Path, error: type[FileError], what: str, list_cmd: str) -> str:
    """A user's YAML file's text, or ``error`` naming the file and why it cannot be read."""
    text, why = read_text_file(path)
    if text is None:
        raise error(why or "cannot be read", file=str(path),
                    fix=f"give a path to a {what} .yaml (UTF-8 text), or a built-in name (`{list_cmd}`)")
    return text


def resolve_yaml_ref(ref: str, folder: Path, error: type[FileError], what: str,
                     list_cmd: str) -> Path:
    """A path to a ``.yaml`` file, or the name of a built-in one in ``folder``; ``error`` names what is wrong."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        p = Path(ref)
        why = file_problem(p)
        if why:
            raise error(why, file=ref, fix=f"give a path to a {what} .yaml, or a built-in name (`{list_cmd}`)")
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
