"""Atomic file output, strict JSONL reading and append-only JSON-lines logs.

Nothing privret writes is ever half-written: files go to a temporary name in the same
directory and are renamed into place (``os.replace`` is atomic on POSIX); whole output
directories are staged the same way. Logs that grow record by record (the privacy-budget
registry, a generator's step log) are appended to and fsync'd instead: see :func:`append_log_record`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from privret.errors import InputError

T = TypeVar("T")


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it onto ``target`` only on success.

    Works for a file or a directory written at the yielded path.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    staged = tmp / target.name
    try:
        yield staged
        if target.is_dir() and staged.is_dir():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(staged, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staged, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


PRIVATE_DATA_KEY = "contains_private_data"
"""The key of the warning that a JSON file holds private data (:func:`privret.audit.private_output.mark_private`);
:func:`write_json_atomic` writes it first, so the file says so on its first key's line."""


def _ordered(value: Any) -> Any:
    """``value`` with every object's keys sorted, :data:`PRIVATE_DATA_KEY` first."""
    if isinstance(value, dict):
        return {key: _ordered(value[key]) for key in sorted(value, key=lambda k: (k != PRIVATE_DATA_KEY, k))}
    if isinstance(value, (list, tuple)):
        return [_ordered(item) for item in value]
    return value


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """``obj`` as indented JSON, keys sorted (a :data:`PRIVATE_DATA_KEY` warning first)."""
    if isinstance(obj, dict) and PRIVATE_DATA_KEY in obj:
        text = json.dumps(_ordered(obj), indent=2, default=str)
    else:  # the common case: json's own sort, no walk over the object
        text = json.dumps(obj, indent=2, sort_keys=True, default=str)
    write_text_atomic(path, text + "\n")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """Write rows as JSON lines to ``path`` (callers stage ``path`` inside an atomic directory)."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, text) of a UTF-8 file, skipping blank lines.

    Raises :class:`InputError` naming the line on bytes that are not UTF-8.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", path=path)
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(f"not valid UTF-8 (byte {err.start})", path=path, line=number) from None
            if text.strip():
                yield number, text.rstrip("\r\n")


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for every non-blank line; each line must be a JSON object."""
    for number, text in read_lines(path):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"malformed JSON ({err.msg})", path=path, line=number) from None
        except RecursionError:
            raise InputError("JSON nested too deeply", path=path, line=number) from None
        if not isinstance(obj, dict):
            raise InputError("expected a JSON object", path=path, line=number)
        yield number, obj


def require_text(obj: dict, key: str, *, path: str | Path, line: int, allow_empty: bool = False) -> str:
    """Return ``obj[key]`` as a string; missing, non-scalar or empty values are input errors."""
    if key not in obj or obj[key] is None:
        raise InputError("missing", path=path, line=line, field=key)
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"expected a string, got {type(value).__name__}", path=path, line=line, field=key)
    value = str(value)
    if not allow_empty and not value.strip():
        raise InputError("empty", path=path, line=line, field=key)
    return value


def file_sha256(*paths: str | Path) -> str:
    """Content hash of one or more files, used to identify the private dataset in ledgers."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def read_log_records(path: Path, parse: Callable[[Any], T], *, unreadable: str) -> list[T]:
    """``parse(record)`` for every record of an append-only JSON-lines log; no file, no records.

    A torn *last* line (no newline after it: a crash cut the append, so the record never
    counted) is dropped. Any other line that is not UTF-8 JSON accepted by ``parse`` (which
    raises ``ValueError``, pydantic's ``ValidationError`` included, to reject it) is an
    :class:`InputError` saying ``unreadable`` and naming the line.
    """
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(parse(json.loads(line.decode("utf-8"))))
        except (UnicodeDecodeError, ValueError):
            if number == len(lines):  # no newline after it: the append was cut
                continue
            raise InputError(unreadable, path=path, line=number) from None
    return records


def append_log_record(path: Path, line: str) -> None:
    """Append ``line`` (one JSON record, without its newline) to a log and fsync it.

    A torn last line left by a crash mid-append (see :func:`read_log_records`) is replaced.
    """
    with open(path, "ab") as f:
        end = f.tell()
        if end > 0:
            with open(path, "rb") as r:
                keep = r.read().rfind(b"\n") + 1
            if keep != end:
                f.truncate(keep)
        f.write((line + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; PyYAML is slow on megabytes
MAX_CONFIG_NESTING = 64  # PyYAML is quadratic in flow nesting ([[[...]]] 20k deep: > 60 s)


def _bounded_text(path: Path) -> str:
    """The file's text, refusing sizes and bracket nesting that would make PyYAML hang."""
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise InputError(f"config larger than {MAX_CONFIG_BYTES} bytes", path=path)
    text = data.decode("utf-8")
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    if deepest > MAX_CONFIG_NESTING:
        raise InputError(f"config nested more than {MAX_CONFIG_NESTING} brackets deep", path=path)
    return text


def read_yaml_mapping(path: Path) -> dict:
    """A YAML config file's top-level mapping. Refused, with the file (and the line where YAML knows it): a missing
    file or a directory, text that is not UTF-8, too large or nested too deeply, invalid YAML, a key given twice in
    one mapping (YAML would keep the last one silently), and anything but a mapping at the top. An empty file (or
    comments only) is the empty mapping."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        """SafeLoader that refuses a key given twice in one mapping. Merge keys (``<<: *anchor``) are left to
        SafeLoader, so a mapping may still override what it merges; an unhashable key gets SafeLoader's error."""

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    repeated = key in seen
                except TypeError:  # a list or mapping as key
                    break
                if repeated:
                    raise yaml.constructor.ConstructorError(None, None, f"key '{key}' given twice",
                                                            key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    if not path.is_file():
        raise InputError("config file not found" if not path.exists() else "config path is not a file", path=path)
    try:
        raw = yaml.load(_bounded_text(path), Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise InputError("YAML nested too deeply", path=path) from None
    except UnicodeDecodeError:
        raise InputError("config is not valid UTF-8", path=path) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise InputError(f"invalid YAML ({getattr(err, 'problem', err)})", path=path,
                         line=mark.line + 1 if mark else None) from None
    if raw is None:  # an empty file, or comments only: no field set
        return {}
    if not isinstance(raw, dict):
        raise InputError("config must be a YAML mapping", path=path)
    return raw
