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


# --- no import cycles, counting the imports inside functions -----------------------------------------------------

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def module_names(root: Path, package: str) -> dict[str, Path]:
    """{dotted module name: path} of every module of the package in `root` (a package is its ``__init__``)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST):
    """Every import statement under `node`, at any depth, except inside ``if TYPE_CHECKING:`` bodies."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    for field, value in ast.iter_fields(node):
        if isinstance(node, ast.If) and field == "body" and _is_type_checking(node.test):
            continue
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST):
                yield from _imports(child)


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of the dotted `name` that is one of `modules` (an imported class is its module's)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """{module: the package's modules it imports}; ``from p.x import y`` is an edge to ``p.x.y`` when that is a
    module, else to ``p.x``; relative imports are resolved."""
    modules = module_names(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {_known(alias.name, modules) for alias in node.names}
                continue
            base = node.module or ""
            if node.level:
                anchor = own_package.split(".")[: len(own_package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                targets.add(_known(f"{base}.{alias.name}", modules) if f"{base}.{alias.name}" in modules
                            else _known(base, modules))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_privret_modules_import_one_another_without_cycles() -> None:
    graph = import_graph(SRC, "privret")
    assert len(graph) > 50 and sum(len(targets) for targets in graph.values()) > 200, "the scan lost its way"
    assert import_cycles(graph) == []


def test_cycle_check_catches_a_cycle_through_an_import_inside_a_function(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("", encoding="utf-8")
    (root / "sub" / "__init__.py").write_text("", encoding="utf-8")
    (root / "base.py").write_text("def load():\n    from pkg.sub import loader\n    return loader\n",
                                  encoding="utf-8")
    (root / "sub" / "loader.py").write_text("from ..base import load\n", encoding="utf-8")
    (root / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import hint\n",
                                   encoding="utf-8")
    (root / "hint.py").write_text("import pkg.typed\n", encoding="utf-8")
    graph = import_graph(root, "pkg")
    assert graph["pkg.base"] == {"pkg.sub.loader"} and graph["pkg.sub.loader"] == {"pkg.base"}
    assert graph["pkg.typed"] == set() and graph["pkg.hint"] == {"pkg.typed"}
    assert import_cycles(graph) == [{"pkg.base", "pkg.sub.loader"}]
    (root / "sub" / "loader.py").write_text("VALUE = 1\n", encoding="utf-8")
    assert import_cycles(import_graph(root, "pkg")) == []


# --- no module over 400 lines, no function over 80 ---------------------------------------------------------------

def long_modules(root: Path) -> dict[str, int]:
    """Modules under `root` over the line limit, with their number of lines."""
    lines = {str(path.relative_to(root)): len(path.read_text(encoding="utf-8").splitlines())
             for path in sorted(root.rglob("*.py"))}
    return {name: count for name, count in lines.items() if count > MAX_MODULE_LINES}


def long_functions(root: Path) -> dict[str, int]:
    """``module:function`` under `root` (methods and nested functions included) over the line limit, with their
    number of lines from ``def`` to the last line of the body."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                count = node.end_lineno - node.lineno + 1
                if count > MAX_FUNCTION_LINES:
                    found[f"{path.relative_to(root)}:{node.name}"] = count
    return found


def test_no_module_over_400_lines() -> None:
    assert long_modules(SRC) == {}


def test_no_function_over_80_lines() -> None:
    assert long_functions(SRC) == {}


def test_size_checks_catch_a_long_module_and_a_long_function(tmp_path: Path) -> None:
    def function(name: str, lines: int) -> str:
        return f"def {name}():\n" + "".join(f"    x{i} = {i}\n" for i in range(lines - 1))

    (tmp_path / "functions.py").write_text(function("fits", 80) + "\n\n" + function("spills", 81), encoding="utf-8")
    (tmp_path / "long_module.py").write_text("".join(f"X{i} = {i}\n" for i in range(401)), encoding="utf-8")
    (tmp_path / "full_module.py").write_text("".join(f"X{i} = {i}\n" for i in range(400)), encoding="utf-8")
    assert long_functions(tmp_path) == {"functions.py:spills": 81}
    assert long_modules(tmp_path) == {"long_module.py": 401}
