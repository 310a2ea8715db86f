"""The README's Python examples run as written, and its set-up commands are the ones CI uses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hermes_state_cli import build_parser

README = Path(__file__).resolve().parent.parent / "README.md"
CI_SCRIPT = README.parent / ".ci" / "run"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_example_runs(index: int, hermes_home: Path) -> None:
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(python_blocks()[index], f"README.md example {index + 1}", "exec"), namespace)
    assert (hermes_home / "state.db").exists()


def test_readme_gives_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    text = README.read_text(encoding="utf-8")
    setup = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", setup, re.S)
    assert commands == [
        "pip install -e . && hermes-state doctor",
        "pip install -e '.[test]' && pytest",
    ]
    ci = CI_SCRIPT.read_text(encoding="utf-8")
    assert "pip install --quiet -e '.[test]'" in ci
    lines = ci.rstrip().splitlines()
    assert lines[-1] == "mypy --strict $modules", "the type check comes last"
    tests_run, modules_read = lines.index("pytest"), lines.index("modules=$(python - <<'EOF'")
    assert tests_run < modules_read, "the test suite runs first"
    assert '["tool"]["setuptools"]["py-modules"]' in "\n".join(lines[modules_read:])


def test_every_module_of_the_package_is_installed() -> None:
    """A top-level module missing from ``py-modules`` imports from a checkout but not from an
    install (the console script run elsewhere would fail)."""
    listed = set(re.findall(r'"(hermes_state\w*)"', (README.parent / "pyproject.toml").read_text()))
    present = {p.stem for p in README.parent.glob("hermes_state*.py")}
    assert present <= listed, sorted(present - listed)


def test_the_command_line_examples_are_commands_the_parser_accepts() -> None:
    section = README.read_text(encoding="utf-8").split("## Command line", 1)[1]
    section = section.split("\n## ", 1)[0]
    lines = [line for block in re.findall(r"```bash\n(.*?)```", section, re.S)
             for line in block.splitlines() if line.startswith("hermes-state ")]
    assert len(lines) >= 5
    parser = build_parser()
    for line in lines:
        argv = shlex.split(line.split(" > ")[0])[1:]  # without the shell's redirection
        parser.parse_args(argv)  # exits (and fails the test) on anything it refuses


def test_the_layout_names_every_module() -> None:
    layout = README.read_text(encoding="utf-8").split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(hermes_state\w*)`", layout))
    present = {p.stem for p in README.parent.glob("hermes_state*.py")}
    assert present == named, (sorted(present - named), sorted(named - present))
