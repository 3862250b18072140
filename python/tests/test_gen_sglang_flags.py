"""scripts/gen-sglang-flags.py: the reading rules, on small synthetic server_args.py files (SGLang's own file is
never stored here; docs/sglang-rules.md says how to run the generator against it)."""
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent.parent / "scripts" / "gen-sglang-flags.py"
spec = importlib.util.spec_from_file_location("gen_sglang_flags", SCRIPT)
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

EXPLICIT = """
class ServerArgs:
    model_path: str
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path", "--model", type=str)
        parser.add_argument("--port", type=int, help=f"the port {1}")
        group = parser.add_argument_group("x")
        group.add_argument("--host")
"""

DATACLASS = """
class ServerArgs:
    model_path: A[str, Arg(help="m", aliases=["--model"])]
    plain: int = 1
    tp_size: A[int, Arg(help="t", cli_name="--tensor-parallel-size", aliases=["--tp"])] = 1
    hidden: A[bool, Arg(no_cli=True)] = False
    bare: A[Optional[str], "help " "text"] = None
    formatted: A[str, f"help {1}"] = ""
    twice: A[int, "first"] = 1
    later: Annotated[int, Arg(help="l")] = 0
    twice: A[int, Arg(help="second", aliases=["--twice-alias"])] = 2
    toggle: A[Optional[bool], Arg(help="b", aliases=["--tog"], action=argparse.BooleanOptionalAction), NS("x")] = None
    custom: A[Optional[str], Arg(help="c", action=SomeAction), NS("x")] = None
    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        choices = set(CHOICES)
        if flag():
            choices.add("extra")
        parser.add_argument("--config")
        parser.add_argument("--switch", action=BooleanOptionalAction)
"""


def actions(source):
    return gen.server_args_actions(textwrap.dedent(source))


def test_explicit_calls_in_source_order_after_help():
    got, explicit, from_dataclass = actions(EXPLICIT)
    assert got == [["-h", "--help"], ["--model-path", "--model"], ["--port"], ["--host"]]
    assert (explicit, from_dataclass) == (3, False)


def test_dataclass_fields_then_explicit_calls():
    got, explicit, from_dataclass = actions(DATACLASS)
    assert got == [
        ["-h", "--help"],
        ["--model-path", "--model"],
        ["--tensor-parallel-size", "--tp"],
        ["--bare"],
        ["--formatted"],
        # Declared twice: the first place, the last annotation.
        ["--twice", "--twice-alias"],
        ["--later"],
        # argparse's BooleanOptionalAction adds `--no-X` after each `--X`.
        ["--toggle", "--no-toggle", "--tog", "--no-tog"],
        ["--custom"],
        # A condition that registers nothing is no obstacle.
        ["--config"],
        ["--switch", "--no-switch"],
    ]
    assert (explicit, from_dataclass) == (2, True)


@pytest.mark.parametrize(
    "body",
    [
        'if x:\n                parser.add_argument("--a")',
        'for n in names:\n                parser.add_argument(n)',
        'parser.add_argument(NAME)',
        'parser.add_argument(*names)',
        'parser.add_argument("--no-x", action=argparse.BooleanOptionalAction)',
    ],
)
def test_shapes_it_cannot_read_statically_stop_it(body):
    source = f"""
    class ServerArgs:
        @staticmethod
        def add_cli_args(parser):
            {body}
    """
    with pytest.raises(gen.Unsupported):
        actions(source)


def sources(tmp_path):
    """server_args.py stand-ins for the three commits, as --server-args."""
    old, new, sep = tmp_path / "old.py", tmp_path / "new.py", tmp_path / "sep.py"
    old.write_text(textwrap.dedent(EXPLICIT))
    new.write_text(textwrap.dedent(DATACLASS))
    sep.write_text(textwrap.dedent(DATACLASS).replace('"--config"', '"--config-file"'))
    return {"6076066e3": old, "d4801be": new, "77e0052": sep, "release": release_package(tmp_path)}


def release_package(tmp_path, version="0.5.23"):
    """A stand-in for an installed sglang 0.5.23: fields in namespace classes
    under srt/arg_groups/fields/, assembled by server_args.py."""
    pkg = tmp_path / "site" / "sglang"
    fields = pkg / "srt" / "arg_groups" / "fields"
    fields.mkdir(parents=True)
    (pkg / "_version.py").write_text(f"__version__: str\n__version__ = version = {version!r}\n")
    (pkg / "srt" / "arg_groups" / "field_order.py").write_text('POSITIONAL_FIELD_ORDER = ("model_path", "tp_size")\n')
    (fields / "one.py").write_text(textwrap.dedent("""
        import msgspec
        class One(msgspec.Struct):
            _NS_PATH = "one"
            port: A[int, "The port."] = 30000
            hidden: A[bool, Arg(no_cli=True)] = False
            tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
        """))
    (fields / "two.py").write_text(textwrap.dedent("""
        import msgspec
        class Two(msgspec.Struct):
            _NS_PATH = "two"
            model_path: A[str, "The model."] = ""
            flag: A[bool, Arg(action=argparse.BooleanOptionalAction)] = False
        """))
    (pkg / "srt" / "server_args.py").write_text(textwrap.dedent("""
        from sglang.srt.arg_groups.fields.one import (
            One,
        )
        from sglang.srt.arg_groups.fields.two import Two
        class ServerArgs:
            def __post_init__(self):
                pass
            @staticmethod
            def add_cli_args(parser):
                add_cli_args_from_dataclass(parser, ServerArgs)
                parser.add_argument("--enable-dp-attention", action=DeprecatedStoreTrueAction)
        _INPUT_NAMESPACES = [One, Two]
        """))
    return pkg


def run_args(given):
    out = [sys.executable, str(SCRIPT)]
    for commit, path in given.items():
        if commit == "release":
            out += ["--sglang-package", str(path)]
        else:
            out += ["--server-args", f"{commit}={path}"]
    return out


def test_release_fields_follow_the_positional_order_then_the_namespaces(tmp_path):
    out = tmp_path / "flags.rs"
    subprocess.run([*run_args(sources(tmp_path)), "--out", str(out)], check=True, capture_output=True)
    table = out.read_text().split("pub const FLAGS_SGLANG_0_5_23")[1]
    assert [line.strip() for line in table.split("];")[0].strip().splitlines()[1:]] == [
        '&["-h", "--help"],',
        '&["--model-path"],',
        '&["--tp-size", "--tensor-parallel-size"],',
        '&["--port"],',
        '&["--flag", "--no-flag"],',
        '&["--enable-dp-attention"],',
    ]
    assert "at sglang 0.5.23 as released on PyPI" in out.read_text()
    assert "/// Read from 4 `Annotated` fields, then 1 explicit `add_argument` calls." in out.read_text()


def test_release_of_another_version_is_refused(tmp_path):
    given = sources(tmp_path)
    given["release"] = release_package(tmp_path / "other", version="0.5.24")
    done = subprocess.run([*run_args(given), "--out", str(tmp_path / "f.rs")], capture_output=True, text=True)
    assert done.returncode != 0 and "is sglang 0.5.24, not 0.5.23" in done.stderr


def test_check_reports_a_difference_and_exits_1(tmp_path):
    run = run_args(sources(tmp_path))
    out = tmp_path / "flags.rs"
    subprocess.run([*run, "--out", str(out)], check=True, capture_output=True)
    text = out.read_text()
    assert "pub const FLAGS_6076066E3: &[&[&str]] = &[\n" in text
    assert "pub const FLAGS_77E0052: &[&[&str]] = &[\n" in text
    assert '    &["--tensor-parallel-size", "--tp"],\n' in text
    assert "/// Read from 3 `add_argument` calls.\n" in text
    assert "/// Read from 8 `Annotated` fields, then 2 explicit `add_argument` calls.\n" in text
    assert "/// `2026-09`: one entry per argparse action" in text
    assert subprocess.run([*run, "--out", str(out), "--check"], capture_output=True).returncode == 0
    out.write_text(text.replace('"--tp"', '"--tq"'))
    checked = subprocess.run([*run, "--out", str(out), "--check"], capture_output=True, text=True)
    assert checked.returncode == 1 and '+    &["--tensor-parallel-size", "--tp"],' in checked.stdout


def test_a_commit_without_source_keeps_its_table(tmp_path):
    given = sources(tmp_path)
    out = tmp_path / "flags.rs"
    subprocess.run([*run_args(given), "--out", str(out)], check=True, capture_output=True)
    # An earlier table (d4801be's, the first to end so), edited so that
    # keeping it verbatim is visible.
    out.write_text(out.read_text().replace('"--no-switch"],\n];', '"--no-switch", "--kept"],\n];', 1))
    before = out.read_text()
    assert before.count('"--kept"') == 1
    only_sep = run_args({"77e0052": given["77e0052"]})
    done = subprocess.run([*only_sep, "--out", str(out)], check=True, capture_output=True, text=True)
    assert "no server_args.py for 6076066e3" in done.stderr and "no server_args.py for d4801be" in done.stderr
    assert out.read_text() == before
    # The table that has a source is regenerated.
    given["77e0052"].write_text(textwrap.dedent(EXPLICIT))
    subprocess.run([*only_sep, "--out", str(out)], check=True, capture_output=True)
    after = out.read_text()
    assert after.count('"--kept"') == 1 and after.split("FLAGS_77E0052")[1].count('"--config') == 0
    # Neither a source nor a table: an error, nothing written.
    empty = tmp_path / "empty.rs"
    failed = subprocess.run([*only_sep, "--out", str(empty)], capture_output=True, text=True)
    assert failed.returncode != 0 and "no server_args.py for 6076066e3" in failed.stderr and not empty.exists()
