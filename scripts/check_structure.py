"""The structure rules of eagle_batch/, checked statically (no import of the package); exit 1 on a violation.

- layers: the packages follow the data flow (prepare -> capture -> store -> launch -> train), and a module
  imports only from its own package or from a lower layer, never from a higher one or a sibling of its own
  layer. From the bottom up:

      0  eagle_batch (the package root), errors, environment, progress   what every stage may use
      1  config, models, demo_data                                        the config, model folders, inputs
      2  store                                                            the task store: what stages share
      3  data | capture | train                                           the stages: prepare's rows, the
                                                                          engine's states, the draft; each
                                                                          reads or writes the store, none
                                                                          imports another
      4  launch | interop | evaluate                                      jobs that run capture and train;
                                                                          peers' formats; serving a draft
      5  regenerate                                                       a run of its own, through launch
      6  cli (one module per command), bench, demo, report, reference,    the user-facing top: the verbs
         __main__, and any module named cli.py or cli_*.py elsewhere      parse arguments and may call any
                                                                          stage

  So train imports neither capture nor data: what serving a draft needs from them lives in evaluate.
- no import cycle between modules, lazy imports (inside functions) included: an edge A -> B for every
  `import B` / `from B import x` anywhere in A; `from pkg import name` counts as pkg/__init__ unless
  `name` is a submodule; cycles are the strongly connected components of that graph;
- environment variables are read (and set) only in eagle_batch/environment.py: no `os.environ`, `os.getenv`,
  `os.putenv` or `os.unsetenv` elsewhere, so every variable the package obeys is listed in one module;
- no module over MAX_MODULE lines and no function over MAX_FUNCTION lines, unless the file says why in a
  comment `# structure: <reason>` (one per file, naming what is long).

    python scripts/check_structure.py            # prints the violations, or "structure ok"
    python scripts/check_structure.py --root DIR  # the same rules on another copy of the tree
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "eagle_batch"
MAX_MODULE = 500
MAX_FUNCTION = 80
LAYERS: list[set[str]] = [
    {"", "errors", "environment", "progress", "units"},
    {"ownership"},
    {"config", "models", "demo_data"},
    {"store"},
    {"data", "capture", "train"},
    {"launch", "interop", "evaluate"},
    {"regenerate"},
    {"cli", "bench", "demo", "report", "reference", "__main__"},
]
ENVIRONMENT_MODULE = f"{PKG}.environment"
_ENVIRON_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


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


def package_of(mod: str) -> str:
    """The top-level package (or module) under eagle_batch: `eagle_batch.store.writer` -> "store"."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(mod: str) -> int:
    leaf = mod.rpartition(".")[2]
    if leaf == "cli" or leaf.startswith("cli_"):
        return len(LAYERS) - 1  # a verb module: the CLI layer, wherever it lives
    for i, names in enumerate(LAYERS):
        if package_of(mod) in names:
            return i
    raise KeyError(f"{mod}: its package {package_of(mod)!r} has no layer; add it to LAYERS in {Path(__file__).name}")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    top = len(LAYERS) - 1
    for mod in sorted(graph):
        mine = layer_of(mod)
        for dep in sorted(graph[mod]):
            theirs = layer_of(dep)
            if mine == top or package_of(dep) == package_of(mod) or theirs < mine:
                continue
            where = "a higher layer" if theirs > mine else "a sibling of its layer"
            out.append(f"layer: {mod} (layer {mine}) imports {dep} ({where}, layer {theirs})")
    return out


def environment_reads(mods: dict[str, Path]) -> list[str]:
    out = []
    for mod, path in mods.items():
        if mod == ENVIRONMENT_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            hit = (
                isinstance(node, ast.Attribute)
                and node.attr in _ENVIRON_NAMES
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ) or (
                isinstance(node, ast.ImportFrom)
                and node.module == "os"
                and any(a.name in _ENVIRON_NAMES for a in node.names)
            )
            if hit:
                out.append(
                    f"{path.relative_to(ROOT)}:{node.lineno}: environment variables are read only in "
                    f"eagle_batch/environment.py (add a named accessor there)"
                )
    return out


def main(argv: list[str] | None = None) -> int:
    global ROOT
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--root"]:
        ROOT = Path(args[1]).resolve()
    mods = modules()
    graph = import_graph(mods)
    problems = (
        [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph)]
        + layer_violations(graph)
        + environment_reads(mods)
        + long_code(mods)
    )
    print(
        "\n".join(problems)
        if problems
        else f"structure ok: {len(mods)} modules in {len(LAYERS)} layers, no import cycle, environment read in "
        f"one module, none over {MAX_MODULE} lines, no function over {MAX_FUNCTION} lines"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
