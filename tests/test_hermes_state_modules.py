"""The module layout: ``__all__`` of each module is what its siblings may use.

Every top-level module is parsed with ``ast``: a ``from hermes_state_x import name`` and a
``hermes_state_x.name`` through an imported module must name something ``hermes_state_x``
lists in ``__all__`` (so never a ``_private`` name), and what ``__all__`` lists must exist.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from conftest import REPO_ROOT

MODULES = sorted(p.stem for p in REPO_ROOT.glob("hermes_state*.py"))


def public_names(module: str) -> set[str]:
    return set(importlib.import_module(module).__all__)


def _dunder(name: str) -> bool:
    """Module metadata (``__version__``, ``__name__``): no sibling's private state."""
    return name.startswith("__") and name.endswith("__")


def sibling_uses(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) for every name this file takes from a sibling module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    aliases: dict[str, str] = {}
    uses: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES:
            uses += [(node.lineno, node.module, a.name) for a in node.names
                     if a.name != "*" and not _dunder(a.name)]
        elif isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names if a.name in MODULES})
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and not _dunder(node.attr)
        ):
            uses.append((node.lineno, aliases[node.value.id], node.attr))
    return uses


@pytest.mark.parametrize("module", MODULES)
def test_a_module_takes_from_its_siblings_only_what_they_list_in_all(module: str) -> None:
    path = REPO_ROOT / f"{module}.py"
    crossing = [
        f"{path.name}:{line}: {source}.{name}"
        for line, source, name in sibling_uses(path)
        if source != module and name not in public_names(source)
    ]
    assert crossing == []


@pytest.mark.parametrize("module", MODULES)
def test_every_name_a_module_lists_in_all_exists_and_is_public(module: str) -> None:
    loaded = importlib.import_module(module)
    assert len(loaded.__all__) == len(set(loaded.__all__)), "a name is listed twice"
    for name in loaded.__all__:
        assert not name.startswith("_"), name
        assert hasattr(loaded, name), name


def test_the_check_sees_a_private_crossing(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import hermes_state_fts as fts\n"
        "from hermes_state_connect import _savepoint_ids, transaction\n"
        "fts._reset_shadow_tables(None, 't')\n"
        "fts.__name__\n",
        encoding="utf-8",
    )
    uses = {(source, name) for _, source, name in sibling_uses(sample)}
    assert uses == {("hermes_state_fts", "_reset_shadow_tables"),
                    ("hermes_state_connect", "_savepoint_ids"),
                    ("hermes_state_connect", "transaction")}
    assert "_savepoint_ids" not in public_names("hermes_state_connect")
    assert "transaction" in public_names("hermes_state_connect")


def test_the_command_line_uses_no_private_attribute_of_the_store() -> None:
    """doctor reads health through SessionDB's public methods, not ``db._read``."""
    private = []
    for path in sorted(REPO_ROOT.glob("hermes_state_cli*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        private += [
            f"{path.name}:{node.lineno}: .{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ]
    assert private == []
