"""The committed reports' tables: ``rlx report --runs`` rebuilds each from its *-runs.csv, and refuses a file or a
metric it cannot rebuild from in one line."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest
from conftest import REPO, table_rows

from rlx_cli.config.errors import UserError
from rlx_cli.studies.report import report_command


def test_runs_file_mistakes(tmp_path):
    with pytest.raises(UserError, match=r"--runs nope.csv: no such file"):
        report_command(runs=Path("nope.csv"))
    (tmp_path / "x-runs.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="not a table's per-run data"):
        report_command(runs=tmp_path / "x-runs.csv")
    with pytest.raises(UserError, match=r"--runs rebuilds the table from its file; --x needs the MLflow store"):
        report_command(runs=tmp_path / "x-runs.csv", x="samples")
    committed = REPO / "reports" / "off-policy" / "table-runs.csv"
    with pytest.raises(UserError, match=r"--metric eval/accuracy: .* holds eval/accuracy_sampled"):
        report_command(runs=committed, metric="eval/accuracy")
    with pytest.raises(UserError, match=r"no metric 'train/nope' in .*table-curves.csv \(valid: eval/accuracy, eval/"):
        report_command(runs=committed, extra_metrics="train/nope")


COMMITTED = sorted((REPO / "reports").rglob("*-runs.csv"))
REBUILD = runpy.run_path(str(REPO / "reports" / "rebuild.py"), run_name="rebuild")
TABLES = REBUILD["committed"]()


def test_every_committed_table_with_per_run_data_is_rebuilt():
    """Every *-runs.csv beside a table and every *-verdicts.md is in the rebuild's list (a fit table aside)."""
    beside = {p.with_name(p.name.removesuffix("-runs.csv") + ".md") for p in COMMITTED}
    assert len(TABLES) >= 56 and sum(t.name.endswith("-verdicts.md") for t in TABLES) == 18
    assert {p.name for p in beside - set(TABLES)} == {"fit.md"}  # the sigmoid fit's table: checked below


@pytest.mark.parametrize("path", TABLES, ids=[str(p.relative_to(REPO / "reports")) for p in TABLES])
def test_committed_tables_rebuild_byte_for_byte(path):
    """Acceptance: ``rlx report --runs`` on each committed table's per-run data, with the options its caption states
    (``reports/rebuild.py``), writes the committed file byte for byte: every cell of every row (means, tests, both
    adjusted p, the interval and its level, the MDE, the verdict and its seeds, eval SE, health, the extra columns),
    the notes and the legend. What only the store knew (the caption's budget in words, the experiment line, the AUC
    and samples-drawn cells) is kept from the committed file."""
    assert REBUILD["rebuilt"](path) == path.read_text()


@pytest.mark.parametrize("where", ["regime", "default"])
def test_the_staleness_pair_tables_rebuild_byte_for_byte(where):
    pairs = runpy.run_path(str(REPO / "reports" / "staleness" / "pairs.py"), run_name="pairs")
    runs = f"reports/staleness/{where}-runs.csv"
    assert pairs["pair_table"](runs) == (REPO / "reports" / "staleness" / f"{where}-pairs.md").read_text()


def test_the_sigmoid_fit_table_rebuilds_its_observed_means():
    path = REPO / "reports" / "entropy" / "equal-compute" / "fit-runs.csv"
    committed = path.with_name("fit.md").read_text()
    headers = [c.strip() for c in committed.splitlines()[2].strip("|").split("|")]
    base = re.search(r"ΔA vs (.+?) \[", committed).group(1)
    again = table_rows(report_command(runs=path, baseline=base))
    observed = {r[0]: r[headers.index("observed")] for r in table_rows(committed)}
    assert observed == {r[0]: r[1].strip("*").split(" ±")[0] for r in again}
