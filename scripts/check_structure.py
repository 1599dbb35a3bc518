"""The structure rules of eagle_batch/, checked statically (no import of the package); exit 1 on a violation.

- no import cycle between modules, lazy imports (inside functions) included: an edge A -> B for every
  `import B` / `from B import x` anywhere in A; `from pkg import name` counts as pkg/__init__ unless
  `name` is a submodule; cycles are the strongly connected components of that graph;
- no module over MAX_MODULE lines and no function over MAX_FUNCTION lines, unless the file says why in a
  comment `# structure: <reason>` (one per file, naming what is long).

    python scripts/check_structure.py            # prints the violations, or "structure ok"
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "eagle_batch"
MAX_MODULE = 500
MAX_FUNCTION = 80


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PKG).rglob("*.py"))}


def _resolve(mod: str, is_pkg: bool, level: int, target: str | None) -> str:
    if not level:
        return target or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node.level, node.module)
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = subs if len(subs) == len(node.names) else [base] + subs
            for t in targets:
                while t and t not in mods:  # `import eagle_batch.store.writer` -> the deepest known module
                    t = t.rpartition(".")[0]
                if t and t != mod and t.startswith(PKG):
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def long_code(mods: dict[str, Path]) -> list[str]:
    out = []
    for _mod, path in mods.items():
        text = path.read_text()
        if "# structure:" in text:
            continue
        n = len(text.splitlines())
        if n > MAX_MODULE:
            out.append(f"{path.relative_to(ROOT)}: {n} lines (> {MAX_MODULE})")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION:
                    out.append(
                        f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}() {length} lines (> {MAX_FUNCTION})"
                    )
    return out


def main() -> int:
    mods = modules()
    problems = [f"import cycle: {' <-> '.join(c)}" for c in cycles(import_graph(mods))] + long_code(mods)
    print(
        "\n".join(problems)
        if problems
        else f"structure ok: {len(mods)} modules, no import cycle, "
        f"none over {MAX_MODULE} lines, no function over {MAX_FUNCTION} lines"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
