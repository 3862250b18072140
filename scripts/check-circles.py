#!/usr/bin/env python3
"""Finds circles of file-to-file imports in src/ (Rust) and python/ (Python).

A circle is a loop in the graph whose nodes are source files and whose edges
are "file A uses a name that file B defines". Exit status 1 and every circle
printed (one line each, files joined by " -> ") when any exists; 0 otherwise.

Rust (the library crate under src/; src/bin/ is a separate crate):
- Every `.rs` file is a module: `src/lib.rs` is `crate`, `a/b.rs` and
  `a/b/mod.rs` are `crate::a::b` (a `#[path]` attribute on a `mod` is
  followed).
- Paths are read from `use` items (a group `a::{b, c::d}` counts per name,
  `as` renames are followed) and from paths written in code that start with
  `crate::`, `super::` or `self::`, or with the name of a child module.
  Paths naming anything else (std, external crates) are ignored.
- A path resolves to the deepest module file it names (`foo/mod.rs` or
  `foo.rs`); the next segment is a name in that file. When that file does not
  define the name but imports it (`use`, `pub use`, a glob `use x::*` whose
  target has it), the name is chased to the file that defines it.
- Left out: a module's use of its direct child (no chasing through the
  child's re-exports, so reaching a folder only through its `mod.rs` is
  fine), and a `super::` use of the direct parent for a name the parent
  defines itself. A parent's name that the parent imports from elsewhere is
  chased, so a child reaching a sibling through its parent still counts.
- Test code is left out: files named `tests.rs` or `*_tests.rs`, and any
  item under `#[cfg(test)]` (`mod tests { .. }`, `mod x;`, `use ..;`).
  Tests sit next to the code they test and use it freely; counting them
  would only report test-to-code pairs, never a layering problem.

Python (every `.py` under python/, tests and interop peers included):
- `import x.y`, `from x import y`, `from . import y`, `from .x import y`,
  at any depth in the file (imports inside functions count too). A module
  imported whole (`import pdx`) counts per attribute used (`pdx.Engine`).
- `from pkg import name` resolves to the submodule `pkg/name.py` when it
  exists, else to the name in `pkg/__init__.py`, chased through that file's
  own imports to the file that defines it.
- Left out, as for Rust: a package's `__init__.py` importing its own direct
  submodule, and a submodule importing a name its package's `__init__.py`
  defines itself.

Usage: scripts/check-circles.py [--graph]   (--graph also prints every edge)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUST_ROOT = ROOT / "src"
PY_ROOT = ROOT / "python"

# ---------------------------------------------------------------- Rust


def strip_rust(text: str) -> str:
    """Blanks comments and string/char literals, keeping offsets and lines."""
    out = list(text)
    i, n = 0, len(text)

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 64]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            blank(i, end)
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\.|\\u\{[0-9a-fA-F]+\}|\\x..|[^\\'])'", text[i:i + 16])
            if m:
                blank(i, i + len(m.group(0)))
                i += len(m.group(0))
            else:
                i += 1  # a lifetime
        else:
            i += 1
    return "".join(out)


def matching_brace(text: str, open_at: int) -> int:
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(text) - 1


CFG_TEST = re.compile(r"#\[cfg\(test\)\]")


def drop_test_items(text: str) -> tuple[str, list[str]]:
    """Blanks every item under #[cfg(test)]; returns the text and the
    names of `mod x;` declarations so dropped."""
    dropped: list[str] = []
    out = list(text)
    for m in CFG_TEST.finditer(text):
        k = m.end()
        # skip further attributes
        while True:
            a = re.compile(r"\s*#\[").match(text, k)
            if not a:
                break
            depth, j = 0, a.end() - 1
            while j < len(text):
                if text[j] == "[":
                    depth += 1
                elif text[j] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            k = j + 1
        semi = text.find(";", k)
        brace = text.find("{", k)
        if semi >= 0 and (brace < 0 or semi < brace):
            end = semi
            d = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text[k:semi + 1])
            if d:
                dropped.append(d.group(1))
        else:
            end = matching_brace(text, brace)
        for q in range(m.start(), end + 1):
            if out[q] != "\n":
                out[q] = " "
    return "".join(out), dropped


def is_test_file(path: Path) -> bool:
    return path.name == "tests.rs" or path.name.endswith("_tests.rs")


class RustModule:
    def __init__(self, path: Path, modpath: tuple[str, ...]):
        self.path = path
        self.modpath = modpath
        raw = path.read_text()
        self.text, self.test_children = drop_test_items(strip_rust(raw))
        self.children: dict[str, Path] = {}
        self.imports: dict[str, tuple[str, ...]] = {}  # local name -> absolute path
        self.globs: list[tuple[str, ...]] = []
        self.uses: list[tuple[tuple[str, ...], bool]] = []  # (absolute path, via super of direct parent)
        self.defined: set[str] = set(
            re.findall(r"\b(?:fn|struct|enum|trait|type|const|static|union|mod)\s+(\w+)", self.text)
        ) | set(re.findall(r"macro_rules!\s*(\w+)", self.text))
        self.inline_mods: list[tuple[int, int]] = []
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{", self.text):
            self.inline_mods.append((m.end() - 1, matching_brace(self.text, m.end() - 1)))

    def depth_at(self, offset: int) -> int:
        return sum(1 for a, b in self.inline_mods if a < offset < b)


def rust_file_for(modpath_dir: Path, name: str) -> Path | None:
    for cand in (modpath_dir / f"{name}.rs", modpath_dir / name / "mod.rs"):
        if cand.exists():
            return cand
    return None


def load_rust() -> dict[tuple[str, ...], RustModule]:
    mods: dict[tuple[str, ...], RustModule] = {}

    def visit(path: Path, modpath: tuple[str, ...], child_dir: Path) -> None:
        mod = RustModule(path, modpath)
        mods[modpath] = mod
        for m in re.finditer(r"(#\[path\s*=\s*\"([^\"]+)\"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?\bmod\s+(\w+)\s*;", mod.text):
            name = m.group(3)
            if name in mod.test_children:
                continue
            child = (path.parent / m.group(2)) if m.group(2) else rust_file_for(child_dir, name)
            if child is None or not child.exists() or is_test_file(child):
                continue
            mod.children[name] = child
            sub_dir = child.parent if child.name == "mod.rs" else child.parent / child.stem
            visit(child, modpath + (name,), sub_dir)

    visit(RUST_ROOT / "lib.rs", ("crate",), RUST_ROOT)
    return mods


def expand_use_tree(tree: str) -> list[tuple[tuple[str, ...], str | None]]:
    """`a::{b, c::d as e, f::*}` -> [(a,b),None), ((a,c,d),'e'), ((a,f,'*'),None)]."""
    # keep one space where words were apart (`x as y`), none around punctuation
    tree = re.sub(r"\s*([{}:,])\s*", r"\1", re.sub(r"\s+", " ", tree.strip()))
    out: list[tuple[tuple[str, ...], str | None]] = []

    def walk(prefix: tuple[str, ...], s: str) -> None:
        # split top-level commas
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        for p in parts:
            if not p:
                continue
            brace = p.find("{")
            if brace >= 0:
                head = p[:brace].rstrip(":")
                segs = tuple(x for x in head.split("::") if x)
                walk(prefix + segs, p[brace + 1:p.rfind("}")])
            else:
                alias = None
                if " as " in p:
                    p, alias = p.split(" as ", 1)
                segs = tuple(x for x in p.split("::") if x)
                if segs == ("self",):
                    out.append((prefix, alias))
                else:
                    out.append((prefix + segs, alias))

    walk((), tree)
    return out


def absolutize(mod: RustModule, segs: tuple[str, ...], extra_depth: int) -> tuple[tuple[str, ...], bool] | None:
    """Makes a path absolute (starting at 'crate'); None for external paths.
    The flag says whether it went through exactly one `super` to the file's
    direct parent."""
    if not segs:
        return None
    base = list(mod.modpath)
    i = 0
    supers = 0
    if segs[0] == "crate":
        return tuple(segs), False
    if segs[0] == "self":
        i = 1
    else:
        while i < len(segs) and segs[i] == "super":
            supers += 1
            i += 1
        eff = supers - extra_depth
        if supers == 0:
            if segs[0] in mod.children:
                return tuple(base) + tuple(segs), False
            if segs[0] in mod.imports and len(segs) > 1:
                return mod.imports[segs[0]] + tuple(segs[1:]), False
            return None
        if eff <= 0:
            return tuple(base) + tuple(segs[i:]), False
        if eff > len(base) - 1:
            return None
        base = base[: len(base) - eff]
        return tuple(base) + tuple(segs[i:]), eff == 1
    return tuple(base) + tuple(segs[i:]), False


def collect_rust(mods: dict[tuple[str, ...], RustModule]) -> None:
    use_re = re.compile(r"\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
    for mod in mods.values():
        spans = []
        for m in use_re.finditer(mod.text):
            spans.append((m.start(), m.end()))
            depth = mod.depth_at(m.start())
            for segs, alias in expand_use_tree(m.group(1)):
                segs = tuple(s for s in segs if s != "")
                if segs and segs[0] == "":
                    continue
                absolute = absolutize(mod, segs, depth)
                if absolute is None:
                    continue
                path, via_super = absolute
                if path[-1] == "*":
                    if depth == 0:
                        mod.globs.append(path[:-1])
                    mod.uses.append((path[:-1], via_super))
                    continue
                if depth == 0:
                    mod.imports[alias or path[-1]] = path
                mod.uses.append((path, via_super))
        # paths written in code
        for m in re.finditer(r"(?<![\w:])((?:crate|self|super)(?:::\w+)+|\w+(?:::\w+)+)", mod.text):
            if any(a <= m.start() < b for a, b in spans):
                continue
            segs = tuple(m.group(1).split("::"))
            if segs[0] not in ("crate", "self", "super") and segs[0] not in mod.children and segs[0] not in mod.imports:
                continue
            absolute = absolutize(mod, segs, mod.depth_at(m.start()))
            if absolute is not None:
                mod.uses.append(absolute)


def deepest(mods: dict[tuple[str, ...], RustModule], path: tuple[str, ...]) -> tuple[RustModule, tuple[str, ...]] | None:
    for cut in range(len(path), 0, -1):
        if path[:cut] in mods:
            return mods[path[:cut]], path[cut:]
    return None


def chase(mods: dict[tuple[str, ...], RustModule], path: tuple[str, ...], seen: set[tuple[str, ...]]) -> RustModule | None:
    """The file that defines what `path` names."""
    found = deepest(mods, path)
    if found is None:
        return None
    mod, rest = found
    if not rest or path in seen:
        return mod
    seen.add(path)
    name = rest[0]
    if name in mod.defined:
        return mod
    if name in mod.imports:
        target = chase(mods, mod.imports[name] + rest[1:], seen)
        return target or mod
    for glob in mod.globs:
        target = chase(mods, glob + rest, seen)
        if target is not None and (name in target.defined or name in target.imports):
            return target
    return mod


def rust_edges() -> dict[Path, set[Path]]:
    mods = load_rust()
    collect_rust(mods)
    edges: dict[Path, set[Path]] = {m.path: set() for m in mods.values()}
    for mod in mods.values():
        for path, via_super in mod.uses:
            found = deepest(mods, path)
            if found is None:
                continue
            first, rest = found
            if first.modpath[:-1] == mod.modpath:
                continue  # a module using its direct child
            if via_super and first.modpath == mod.modpath[:-1] and (not rest or rest[0] in first.defined):
                continue  # a child using what its parent defines
            target = chase(mods, path, set())
            if target is None or target is mod:
                continue
            if target.modpath[:-1] == mod.modpath and first is target:
                continue
            edges[mod.path].add(target.path)
    return edges


# ---------------------------------------------------------------- Python


class PyModule:
    def __init__(self, path: Path, name: str):
        self.path = path
        self.name = name
        self.is_package = path.name == "__init__.py"
        self.tree = ast.parse(path.read_text(), str(path))
        self.package = name if self.is_package else name.rpartition(".")[0]
        self.defined: set[str] = set()
        self.imports: dict[str, tuple[str, str | None]] = {}  # local name -> (module, attr)
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self.defined.add(n.id)
        self.uses: list[tuple[str, str | None]] = []  # (module, attr or None)

    def absolute(self, module: str | None, level: int) -> str:
        if level == 0:
            return module or ""
        parts = self.package.split(".") if self.package else []
        parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
        return ".".join(parts + ([module] if module else []))


def load_python() -> dict[str, PyModule]:
    mods: dict[str, PyModule] = {}
    for path in sorted(PY_ROOT.rglob("*.py")):
        rel = path.relative_to(PY_ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = PyModule(path, ".".join(parts))
    for mod in mods.values():
        whole: dict[str, str] = {}
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods or a.name.split(".")[0] in mods:
                        mod.uses.append((a.name, None))
                        local = a.asname or a.name.split(".")[0]
                        whole[local] = a.name if a.asname else local
                        mod.imports.setdefault(local, (whole[local], None))
            elif isinstance(node, ast.ImportFrom):
                base = mod.absolute(node.module, node.level)
                for a in node.names:
                    sub = f"{base}.{a.name}" if base else a.name
                    if sub in mods:
                        mod.uses.append((sub, None))
                        target: tuple[str, str | None] = (sub, None)
                    else:
                        mod.uses.append((base, a.name))
                        target = (base, a.name)
                    mod.imports.setdefault(a.asname or a.name, target)
        # attributes of a module imported whole: `pdx.Engine`
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in whole:
                modname = whole[node.value.id]
                sub = f"{modname}.{node.attr}"
                mod.uses.append((sub, None) if sub in mods else (modname, node.attr))
    return mods


def py_chase(mods: dict[str, PyModule], module: str, attr: str | None, seen: set[tuple[str, str | None]]) -> PyModule | None:
    if module not in mods:
        return None
    mod = mods[module]
    if attr is None or (module, attr) in seen or attr in mod.defined:
        return mod
    seen.add((module, attr))
    if attr in mod.imports:
        target_mod, target_attr = mod.imports[attr]
        return py_chase(mods, target_mod, target_attr, seen) or mod
    return mod


def python_edges() -> dict[Path, set[Path]]:
    mods = load_python()
    edges: dict[Path, set[Path]] = {m.path: set() for m in mods.values()}
    for mod in mods.values():
        for module, attr in mod.uses:
            if module not in mods:
                continue
            first = mods[module]
            if mod.is_package and first.name.rpartition(".")[0] == mod.name:
                continue  # a package's __init__ importing its own submodule
            parent = mod.name.rpartition(".")[0]
            if first.is_package and first.name == parent and (attr is None or attr in first.defined):
                continue  # a submodule using what its package defines itself
            target = py_chase(mods, module, attr, set())
            if target is None or target is mod:
                continue
            if mod.is_package and target.name.rpartition(".")[0] == mod.name and target is first:
                continue
            edges[mod.path].add(target.path)
    return edges


# ---------------------------------------------------------------- circles


def circles(edges: dict[Path, set[Path]]) -> list[list[Path]]:
    """One loop per strongly connected component's elementary cycle through
    each of its edges, shortest first, deduplicated by rotation."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on: set[Path] = set()
    comps: list[list[Path]] = []
    counter = [0]

    sys.setrecursionlimit(10000)

    def strong(v: Path) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
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
                comps.append(comp)

    for v in sorted(edges):
        if v not in index:
            strong(v)

    found: dict[tuple[Path, ...], list[Path]] = {}
    for comp in comps:
        members = set(comp)
        for a in sorted(comp):
            for b in sorted(edges[a] & members):
                # shortest path b -> a inside the component closes the loop a -> b -> .. -> a
                prev: dict[Path, Path | None] = {b: None}
                queue = [b]
                while queue and a not in prev:
                    nxt = []
                    for u in queue:
                        for w in sorted(edges[u] & members):
                            if w not in prev:
                                prev[w] = u
                                nxt.append(w)
                    queue = nxt
                loop = [a]
                node: Path | None = a
                back = []
                while node is not None and node != b:
                    node = prev[node]
                    if node is not None:
                        back.append(node)
                loop += list(reversed(back))
                start = loop.index(min(loop))
                key = tuple(loop[start:] + loop[:start])
                found.setdefault(key, list(key))
    return sorted(found.values(), key=lambda c: (len(c), c))


def main() -> int:
    edges = rust_edges()
    edges.update(python_edges())
    if "--graph" in sys.argv[1:]:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{a.relative_to(ROOT)} -> {b.relative_to(ROOT)}")
    loops = circles(edges)
    for loop in loops:
        names = [str(p.relative_to(ROOT)) for p in loop]
        print("circle: " + " -> ".join(names + names[:1]))
    if loops:
        print(f"{len(loops)} circle(s) of imports; see scripts/check-circles.py for what counts", file=sys.stderr)
        return 1
    print("no circles of imports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
