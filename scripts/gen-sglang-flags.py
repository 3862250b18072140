#!/usr/bin/env python3
"""Regenerate src/config/sglang_flags.rs: the long option strings of
`sglang serve` at the SGLang commits pdx's rule sets follow.

The input is SGLang's own `python/sglang/srt/server_args.py` at each commit,
supplied by the user (nothing of SGLang is in this repository): either a git
checkout of SGLang that holds the commits,

    scripts/gen-sglang-flags.py --sglang ~/src/sglang

or one file per commit,

    scripts/gen-sglang-flags.py --server-args 6076066e3=/tmp/old.py --server-args d4801be=/tmp/new.py \
        --server-args 77e0052=/tmp/sep.py

and, for the release (rule set `2026-10`), the installed package:

    scripts/gen-sglang-flags.py --sglang-package .../site-packages/sglang

A commit given no source (not in the checkout, or no --server-args for it)
keeps its table from the file being written, as it was; one with neither is
an error.

The file is read, never run (Python's `ast`): SGLang need not be installed.
argparse registers one action per `add_argument` call, in call order; where
`add_cli_args` calls `add_cli_args_from_dataclass(parser, ServerArgs)` (the
July 2026 layout), that call registers one action per `ServerArgs` field
annotated `A[T, "help"]` or `A[T, Arg(...)]`, in declaration order, named
`Arg.cli_name` or `--` + the field name with `-` for `_`, then
`Arg.aliases`; `Arg(no_cli=True)` fields and fields without such an
annotation register nothing. An action of `argparse.BooleanOptionalAction`
(an `add_argument` keyword or an `Arg` field) also registers, right after
each `--` string, its `--no-` form, as argparse does. argparse's own
`-h`/`--help` comes first.

`--check` compares with the committed file instead of writing it (exit 1 on
any difference); `--out PATH` writes elsewhere. See docs/sglang-rules.md.
"""
import argparse
import ast
import difflib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "src" / "config" / "sglang_flags.rs"
SERVER_ARGS = "python/sglang/srt/server_args.py"

# The commits the rule sets follow (docs/sglang-rules.md), in file order,
# each with the short form its constant is named after and its rule set.
OLD = "6076066e380a6abae257167ff4c764e624137111"  # PR #26346, rule set `default`
NEW = "d4801be447738522d2c62b49857c83787293be6f"  # main, July 2026, rule set `2026-07`
# zihanlin-ai/sglang, a fork following main (September 2026), rule set `2026-09`
SEP = "77e0052b5f26a739b5a896427be7cc03deae5cd2"
# sglang 0.5.23 as released on PyPI (October 2026), rule set `2026-10`: read
# from the installed package (or the unpacked wheel), whose fields live in
# `srt/arg_groups/fields/`.
REL = "0.5.23"
COMMITS = (OLD, NEW, SEP)
RELEASES = (REL,)
SOURCES = COMMITS + RELEASES
SHORT = {OLD: "6076066e3", NEW: "d4801be", SEP: "77e0052", REL: "sglang_0_5_23"}
RULES = {OLD: "default", NEW: "2026-07", SEP: "2026-09", REL: "2026-10"}

HELP = ("-h", "--help")


class Unsupported(Exception):
    """server_args.py has a shape this generator does not know; it stops rather than guess."""


def is_add_argument(call):
    return isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"


def is_from_dataclass(call):
    return isinstance(call.func, ast.Name) and call.func.id == "add_cli_args_from_dataclass"


def is_registration(call):
    return is_add_argument(call) or is_from_dataclass(call)


def registers(node):
    """Whether `node` holds a registration anywhere inside it."""
    return any(isinstance(n, ast.Call) and is_registration(n) for n in ast.walk(node))


def is_boolean_optional(action):
    """`argparse.BooleanOptionalAction` (or the bare name imported from argparse)."""
    if isinstance(action, ast.Attribute):
        module = action.value
        return action.attr == "BooleanOptionalAction" and isinstance(module, ast.Name) and module.id == "argparse"
    return isinstance(action, ast.Name) and action.id == "BooleanOptionalAction"


def with_negations(strings, action, where):
    """The option strings argparse registers for `strings` under `action`:
    BooleanOptionalAction adds `--no-X` right after each `--X`."""
    if action is None or not is_boolean_optional(action):
        return strings
    out = []
    for s in strings:
        out.append(s)
        if s.startswith("--"):
            if s.startswith("--no-"):
                raise Unsupported(f"{where}: BooleanOptionalAction on {s}, which already starts with --no-")
            out.append("--no-" + s[2:])
    return out


def literal_strings(nodes, what):
    """The values of `nodes`, each a string literal."""
    out = []
    for n in nodes:
        if not (isinstance(n, ast.Constant) and isinstance(n.value, str)):
            raise Unsupported(f"{what}: not a string literal: {ast.unparse(n)}")
        out.append(n.value)
    return out


def option_strings(call):
    """An `add_argument` call's option strings (its positional arguments)."""
    if any(isinstance(a, ast.Starred) for a in call.args):
        raise Unsupported(f"line {call.lineno}: add_argument(*...) cannot be read statically")
    where = f"line {call.lineno}"
    return with_negations(literal_strings(call.args, where), keyword(call, "action"), where)


def keyword(call, name):
    return next((k.value for k in call.keywords if k.arg == name), None)


def field_metadata(ann):
    """For a field annotated `A[T, meta...]` / `Annotated[T, meta...]`: the
    first metadata item that is an `Arg(...)` call or a string (as
    `_unwrap_annotated` picks it at run time); None when there is none."""
    if not isinstance(ann, ast.Subscript):
        return None
    base = ann.value
    name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
    if name not in ("A", "Annotated"):
        return None
    if not isinstance(ann.slice, ast.Tuple):
        return None
    for meta in ann.slice.elts[1:]:
        if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
            return meta
        if isinstance(meta, ast.JoinedStr) or (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
            return meta
        if isinstance(meta, ast.BinOp) and isinstance(meta.op, (ast.Add, ast.Mod)):
            return meta  # a string built with + or %: help text all the same
    return None


def class_fields(cls):
    """`{name: AnnAssign}` of a class body, in declaration order. A field
    annotated twice keeps its first place and its last annotation, as the
    class's `__annotations__` dict (and so `dataclasses.fields`) does."""
    fields = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            fields[stmt.target.id] = stmt
    return fields


def dataclass_actions(cls):
    """The actions `add_cli_args_from_dataclass(parser, cls)` registers."""
    if cls.bases:
        raise Unsupported("ServerArgs has base classes (their fields would come first)")
    return field_actions(class_fields(cls))


def field_actions(fields):
    """The actions of `{name: AnnAssign}` fields, in their order."""
    actions = []
    for stmt in fields.values():
        meta = field_metadata(stmt.annotation)
        if meta is None:
            continue
        field = stmt.target.id
        cli_name, aliases, action = f"--{field.replace('_', '-')}", [], None
        if isinstance(meta, ast.Call):
            no_cli = keyword(meta, "no_cli")
            if no_cli is not None:
                if not isinstance(no_cli, ast.Constant) or not isinstance(no_cli.value, bool):
                    raise Unsupported(f"line {stmt.lineno}: no_cli is not a literal bool")
                if no_cli.value:
                    continue
            named = keyword(meta, "cli_name")
            if named is not None:
                cli_name = literal_strings([named], f"line {stmt.lineno}: cli_name")[0]
            listed = keyword(meta, "aliases")
            if listed is not None:
                if not isinstance(listed, (ast.List, ast.Tuple)):
                    raise Unsupported(f"line {stmt.lineno}: aliases is not a literal list")
                aliases = literal_strings(listed.elts, f"line {stmt.lineno}: aliases")
            action = keyword(meta, "action")
        actions.append(with_negations([cli_name, *aliases], action, f"line {stmt.lineno}"))
    return actions


class Registrations(ast.NodeVisitor):
    """Walks `add_cli_args` in source order, collecting each registration."""

    def __init__(self, cls, fields=None):
        self.cls = cls
        self.fields = fields  # the record's fields where they are assembled elsewhere
        self.actions = []
        self.explicit = 0  # add_argument calls
        self.from_dataclass = False

    def visit_Call(self, call):
        if is_add_argument(call):
            self.actions.append(option_strings(call))
            self.explicit += 1
        elif is_from_dataclass(call):
            target = call.args[1] if len(call.args) > 1 else None
            if not (isinstance(target, ast.Name) and target.id == self.cls.name) or call.keywords:
                raise Unsupported(f"line {call.lineno}: only add_cli_args_from_dataclass(parser, ServerArgs)")
            if self.fields is None:
                self.actions.extend(dataclass_actions(self.cls))
            else:
                self.actions.extend(field_actions(self.fields))
            self.from_dataclass = True
        self.generic_visit(call)

    def visit_If(self, node):
        # A condition that registers nothing (a choice list built at run
        # time) changes no option string; one that does cannot be read.
        if registers(node):
            raise Unsupported(f"line {node.lineno}: a registration under a condition")

    visit_For = visit_While = visit_Try = visit_If


def server_args_actions(source, fields=None):
    """(actions, explicit add_argument calls, whether fields are registered) of
    one server_args.py; `fields` are the record's fields where the release
    layout assembles them from namespaces (see `release_fields`)."""
    tree = ast.parse(source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"), None)
    if cls is None:
        raise Unsupported("no class ServerArgs")
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"), None)
    if fn is None:
        raise Unsupported("no ServerArgs.add_cli_args")
    walk = Registrations(cls, fields)
    for stmt in fn.body:
        walk.visit(stmt)
    for action in walk.actions:
        if not action or not all(s.startswith("-") for s in action):
            raise Unsupported(f"an action with a positional name: {action}")
    return [list(HELP), *walk.actions], walk.explicit, walk.from_dataclass


def module_assign(tree, name):
    """The value of a module-level `name = ...` (last one wins)."""
    value = None
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            value = n.value
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name and n.value:
            value = n.value
    if value is None:
        raise Unsupported(f"no module-level {name}")
    return value


def release_fields(package):
    """The fields of 0.5.23's `ServerArgs` in the order its struct declares
    them: `server_args.py` lists namespace classes in `_INPUT_NAMESPACES`,
    imported from `arg_groups/fields/*.py`; `collect_input_fields` puts the
    names of `field_order.POSITIONAL_FIELD_ORDER` first, in that order, then
    the rest in namespace and declaration order; `ServerArgs`'s own
    annotations follow (a name already there keeps its place)."""
    srt = package / "srt"
    tree = ast.parse((srt / "server_args.py").read_text(encoding="utf-8"))
    spaces = module_assign(tree, "_INPUT_NAMESPACES")
    if not isinstance(spaces, ast.List) or not all(isinstance(e, ast.Name) for e in spaces.elts):
        raise Unsupported("_INPUT_NAMESPACES is not a literal list of names")
    where = {}
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.srt.arg_groups.fields."):
            for alias in n.names:
                where[alias.asname or alias.name] = n.module
    collected = {}
    for e in spaces.elts:
        module = where.get(e.id)
        if module is None:
            raise Unsupported(f"namespace {e.id} is not imported from sglang.srt.arg_groups.fields")
        path = package.parent.joinpath(*module.split(".")).with_suffix(".py")
        mtree = ast.parse(path.read_text(encoding="utf-8"))
        cls = next((n for n in mtree.body if isinstance(n, ast.ClassDef) and n.name == e.id), None)
        if cls is None:
            raise Unsupported(f"no class {e.id} in {module}")
        bases = [ast.unparse(b) for b in cls.bases]
        if bases != ["msgspec.Struct"] or cls.keywords:
            raise Unsupported(f"{e.id} derives from {bases}, not msgspec.Struct alone")
        for name, stmt in class_fields(cls).items():
            if name in collected:
                raise Unsupported(f"{name} is declared by two namespaces")
            collected[name] = stmt
    order_tree = ast.parse((srt / "arg_groups" / "field_order.py").read_text(encoding="utf-8"))
    order = module_assign(order_tree, "POSITIONAL_FIELD_ORDER")
    if not isinstance(order, (ast.Tuple, ast.List)):
        raise Unsupported("POSITIONAL_FIELD_ORDER is not a literal tuple")
    positional = literal_strings(order.elts, "POSITIONAL_FIELD_ORDER")
    known = [n for n in positional if n in collected]
    ordered = {n: collected[n] for n in known}
    ordered.update((n, stmt) for n, stmt in collected.items() if n not in ordered)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"), None)
    if cls is None:
        raise Unsupported("no class ServerArgs")
    for name, stmt in class_fields(cls).items():
        ordered[name] = stmt
    return ordered


def release_actions(package):
    """(actions, explicit add_argument calls, True) of an installed sglang
    package directory (`.../site-packages/sglang`)."""
    source = (package / "srt" / "server_args.py").read_text(encoding="utf-8")
    return server_args_actions(source, release_fields(package))


def release_version(package):
    """The version a package directory declares (`_version.py`'s `__version__`)."""
    tree = ast.parse((package / "_version.py").read_text(encoding="utf-8"))
    value = module_assign(tree, "__version__")
    return literal_strings([value], "__version__")[0]


def rust_string(s):
    if any(c in s for c in '"\\') or not s.isascii() or not s.isprintable():
        raise Unsupported(f"an option string that needs escaping: {s!r}")
    return f'"{s}"'


HEADER = [
    "//! The long option strings of SGLang's `sglang serve` argument parser",
    "//! (`prepare_server_args`: `argparse.ArgumentParser(prog=\"sglang serve\")`,",
    "//! `allow_abbrev` left on), at the commits pdx's rule sets follow.",
    "//!",
    "//! Generated (not hand-written) from `python/sglang/srt/server_args.py` at",
    "//! each commit: the registrations of `ServerArgs.add_cli_args` in source",
    "//! order, after argparse's own `-h`/`--help`. An `add_argument` call is one",
    "//! action; `add_cli_args_from_dataclass(parser, ServerArgs)` is one action",
    "//! per `Annotated[..., Arg(...)]` field in declaration order (`--` + field",
    "//! name with `-`, or `cli_name`, then `aliases`; `no_cli` skipped). An",
    "//! action of `argparse.BooleanOptionalAction` also has each `--` string's",
    "//! `--no-` form right after it. These are names only (facts), in the order",
    "//! argparse registers them, which is the order it lists them in an",
    '//! "ambiguous option" error.',
    "//!",
    "//! Written by `scripts/gen-sglang-flags.py` from SGLang's sources",
    "//! (docs/sglang-rules.md); regenerate it, never edit it.",
]

# One table of an earlier run: its doc comment through its closing `];`.
KEPT_TABLE = re.compile(
    r"^/// `sglang serve`'s options at (?:SGLang commit ([0-9a-f]{40})|sglang ([0-9][0-9a-z.]*) as released)\b.*?^\];\n",
    re.M | re.S,
)


def kept_tables(text):
    """`{commit: block}` of the tables in an earlier sglang_flags.rs."""
    return {m.group(1) or m.group(2): m.group(0) for m in KEPT_TABLE.finditer(text)}


def table(commit, parsed):
    """One commit's table, with the doc comment saying how it was read."""
    actions, explicit, from_dataclass = parsed
    if from_dataclass:
        fields = len(actions) - 1 - explicit
        how = f"{fields} `Annotated` fields, then {explicit} explicit `add_argument` calls"
    else:
        how = f"{explicit} `add_argument` calls"
    if commit in RELEASES:
        origin = [
            f"/// `sglang serve`'s options at sglang {commit} as released on PyPI",
            f"/// (`pip install sglang=={commit}`; its `srt/server_args.py`, with the fields",
            "/// of `srt/arg_groups/fields/` in `ServerArgs`'s order), rule set",
        ]
    else:
        origin = [f"/// `sglang serve`'s options at SGLang commit {commit}, rule set"]
    out = origin + [
        f"/// `{RULES[commit]}`: one entry per argparse action, its option strings in",
        "/// declaration order (`-h`/`--help` first).",
        f"/// Read from {how}.",
        f"pub const FLAGS_{SHORT[commit].upper()}: &[&[&str]] = &[",
    ]
    out += [f"    &[{', '.join(rust_string(s) for s in action)}]," for action in actions]
    out.append("];")
    return "\n".join(out) + "\n"


def render(parsed, kept):
    """The whole of sglang_flags.rs from `{commit: (actions, explicit,
    from_dataclass)}`, taking the table of a commit absent there from `kept`."""
    blocks = []
    for commit in SOURCES:
        if commit in parsed:
            blocks.append(table(commit, parsed[commit]))
        elif commit in kept:
            blocks.append(kept[commit])
        else:
            what = f"sglang {commit}" if commit in RELEASES else f"server_args.py for {SHORT[commit]}"
            raise Unsupported(f"no {what} and no table of it to keep")
    return "\n".join(HEADER) + "\n" + "".join("\n" + b for b in blocks)


def read_from_checkout(checkout, commit):
    """server_args.py at `commit` in `checkout`; None where the checkout lacks the commit."""
    present = subprocess.run(
        ["git", "-C", str(checkout), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    ).returncode == 0
    if not present:
        return None
    try:
        return subprocess.run(
            ["git", "-C", str(checkout), "show", f"{commit}:{SERVER_ARGS}"],
            check=True,
            capture_output=True,
            encoding="utf-8",
        ).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"cannot read {SERVER_ARGS} at {commit} from {checkout}: {e.stderr.strip()}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--sglang", type=Path, help="a git checkout of SGLang that holds the commits")
    shorts = ", ".join(SHORT[c] for c in COMMITS)
    src.add_argument(
        "--server-args",
        action="append",
        metavar="COMMIT=FILE",
        help=f"server_args.py at COMMIT (a prefix of {shorts}); repeat for each",
    )
    p.add_argument(
        "--sglang-package",
        type=Path,
        metavar="DIR",
        help=f"an installed sglang {REL} package directory (site-packages/sglang, or the unpacked wheel's sglang/)",
    )
    p.add_argument("--out", type=Path, default=TARGET, help=f"where to write (default {TARGET.relative_to(ROOT)})")
    p.add_argument("--check", action="store_true", help="compare with --out instead of writing it; exit 1 if different")
    args = p.parse_args()
    if not (args.sglang or args.server_args or args.sglang_package):
        p.error("give --sglang, --server-args or --sglang-package")

    sources = {}
    if args.sglang:
        for c in COMMITS:
            source = read_from_checkout(args.sglang, c)
            if source is not None:
                sources[c] = source
    elif args.server_args:
        for item in args.server_args:
            prefix, sep, path = item.partition("=")
            commit = next((c for c in COMMITS if sep and len(prefix) >= 7 and c.startswith(prefix.lower())), None)
            if commit is None:
                p.error(f"--server-args {item}: expected COMMIT=FILE, COMMIT a prefix of one of {', '.join(COMMITS)}")
            sources[commit] = Path(path).read_text(encoding="utf-8")
    current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    kept = kept_tables(current)
    for c in SOURCES:
        if c not in sources and c != REL and c in kept:
            print(f"no server_args.py for {SHORT[c]}: its table in {args.out} is kept as it is", file=sys.stderr)
    if not args.sglang_package and REL in kept:
        print(f"no sglang {REL} package: its table in {args.out} is kept as it is", file=sys.stderr)
    try:
        parsed = {c: server_args_actions(s) for c, s in sources.items()}
        if args.sglang_package:
            version = release_version(args.sglang_package)
            if version != REL:
                raise Unsupported(f"{args.sglang_package} is sglang {version}, not {REL}")
            parsed[REL] = release_actions(args.sglang_package)
        text = render(parsed, kept)
    except Unsupported as e:
        sys.exit(f"gen-sglang-flags: unsupported server_args.py: {e}")

    if args.check:
        if current != text:
            sys.stdout.writelines(
                difflib.unified_diff(current.splitlines(True), text.splitlines(True), str(args.out), "generated")
            )
            sys.exit(1)
        print(f"{args.out} is up to date")
        return
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
