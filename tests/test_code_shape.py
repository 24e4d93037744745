"""The shape of the code in src/privret: every module docstring states what the module does, its math and its
privacy assumption in at most 15 lines (proofs live in docs/privacy.md). Each check is also run on a planted
violation so that it cannot pass vacuously."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "privret"
MAX_MODULE_DOCSTRING_LINES = 15


def module_docstring_lines(source: str) -> int:
    """Lines of the module docstring of `source` (0 when it has none)."""
    docstring = ast.get_docstring(ast.parse(source))
    return len(docstring.splitlines()) if docstring else 0


def long_module_docstrings(root: Path) -> dict[str, int]:
    """Modules under `root` whose docstring is over the limit, with its number of lines."""
    lines = {str(path.relative_to(root)): module_docstring_lines(path.read_text(encoding="utf-8"))
             for path in sorted(root.rglob("*.py"))}
    return {name: count for name, count in lines.items() if count > MAX_MODULE_DOCSTRING_LINES}


def test_module_docstrings_are_at_most_15_lines() -> None:
    modules = list(SRC.rglob("*.py"))
    assert len(modules) > 50, "the scan found too few modules: it lost its way"
    assert long_module_docstrings(SRC) == {}


def test_docstring_check_catches_a_16_line_docstring(tmp_path: Path) -> None:
    body = "\n".join(f"line {i}" for i in range(1, 17))
    (tmp_path / "planted.py").write_text(f'"""{body}"""\n\nVALUE = 1\n', encoding="utf-8")
    (tmp_path / "short.py").write_text('"""One line."""\n', encoding="utf-8")
    assert long_module_docstrings(tmp_path) == {"planted.py": 16}
