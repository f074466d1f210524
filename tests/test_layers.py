"""The house's shape: the import-linter contracts in pyproject.toml hold (layers, pure components, no cycles) and
fail when broken; the top level stays small, modules short, and docs/development.md's layout table is the tree."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

LINT = Path(sys.executable).parent / "lint-imports"
PACKAGE = REPO / "rlx_cli"


def lint(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": str(Path(sys.executable).parent), "COLUMNS": "300"}  # one line per contract
    env |= {"PYTHONPATH": str(pythonpath)} if pythonpath else {}
    return subprocess.run([str(LINT), "--no-cache", "--no-logo"], cwd=cwd, capture_output=True, text=True, env=env)


def test_the_contracts_hold():
    out = lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 kept, 0 broken" in out.stdout, out.stdout


BREAKS = {  # contract -> (module, the import appended to it), each inside a function, as lazy imports are
    # a lower layer imports a higher one (engine <-> loops is then also a cycle of two siblings)
    "rlx_cli by the flow of a run": ("rlx_cli/engine/precision.py", "from rlx_cli.loops import build"),
    "components are pure functions": ("components/kl.py", "import rlx_cli.config.errors"),
    # two modules of one layer import each other: stats is imported by report
    "no import cycles": ("rlx_cli/studies/stats.py", "from rlx_cli.studies import report"),
}


@pytest.mark.parametrize("broken", sorted(BREAKS))
def test_a_broken_contract_fails_the_check(tmp_path, broken):
    for package in ("rlx_cli", "components"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    module, statement = BREAKS[broken]
    with open(tmp_path / module, "a") as f:
        f.write(f"\n\ndef _broken():\n    {statement}\n")
    out = lint(tmp_path, pythonpath=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    verdicts = {
        line.split(":")[0]: line.split()[-1] for line in out.stdout.splitlines() if line.endswith(("KEPT", "BROKEN"))
    }
    assert verdicts[broken] == "BROKEN", out.stdout


def test_the_top_level_is_small_and_no_module_is_long():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_every_subpackage_says_what_it_holds_and_may_import():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = init.read_text()
        assert doc.startswith('"""') and "May import:" in doc, init


def test_the_layout_table_in_docs_is_the_tree():
    """docs/development.md lists every module of rlx_cli under its subpackage, and nothing else."""
    text = (REPO / "docs" / "development.md").read_text()
    table = text[text.index("## Layout") :]
    listed = set()
    for row in re.findall(r"^\| `rlx_cli/([\w/]*)` \| ([^|]+) \|", table, re.M):
        folder, modules = row
        listed |= {f"{folder}{m}.py" for m in re.findall(r"`(\w+)`", modules)}
    on_disk = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    assert listed == on_disk, (sorted(listed - on_disk), sorted(on_disk - listed))
