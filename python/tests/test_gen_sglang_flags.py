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
    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--config")
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
        ["--config"],
    ]
    assert (explicit, from_dataclass) == (1, True)


@pytest.mark.parametrize(
    "body",
    [
        'if x:\n                parser.add_argument("--a")',
        'for n in names:\n                parser.add_argument(n)',
        'parser.add_argument(NAME)',
        'parser.add_argument(*names)',
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


def test_check_reports_a_difference_and_exits_1(tmp_path):
    old = tmp_path / "old.py"
    new = tmp_path / "new.py"
    old.write_text(textwrap.dedent(EXPLICIT))
    new.write_text(textwrap.dedent(DATACLASS))
    out = tmp_path / "flags.rs"
    run = [sys.executable, str(SCRIPT), "--server-args", f"6076066e3={old}", "--server-args", f"d4801be={new}"]
    subprocess.run([*run, "--out", str(out)], check=True, capture_output=True)
    text = out.read_text()
    assert "pub const FLAGS_6076066E3: &[&[&str]] = &[\n" in text
    assert '    &["--tensor-parallel-size", "--tp"],\n' in text
    assert "(3 `add_argument` calls)" in text and "its 1 explicit `add_argument` calls" in text
    assert subprocess.run([*run, "--out", str(out), "--check"], capture_output=True).returncode == 0
    out.write_text(text.replace('"--tp"', '"--tq"'))
    checked = subprocess.run([*run, "--out", str(out), "--check"], capture_output=True, text=True)
    assert checked.returncode == 1 and '+    &["--tensor-parallel-size", "--tp"],' in checked.stdout
