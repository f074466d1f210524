"""The committed reports' tables: ``rlx report --runs`` rebuilds each from its *-runs.csv, and refuses a file or a
metric it cannot rebuild from in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
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


def reduction_of(caption: str) -> tuple[str, int]:
    """--reduce and --k from a table's caption: "(last ...", "(max ..." or "(mean of the last N ..."."""
    found = re.search(r"\((mean of the last (\d+)|last|max)", caption)
    return ("mean_last_k", int(found.group(2))) if found.group(2) else (found.group(1), 3)


@pytest.mark.parametrize("path", COMMITTED, ids=[str(p.relative_to(REPO / "reports")) for p in COMMITTED])
def test_runs_rebuild_every_committed_table(path):
    """Acceptance 3: ``rlx report --runs`` on each committed *-runs.csv prints the committed table's means ± std, n and
    Δ (its tests where it has them, its extra columns from the *-curves.csv, its eval SE and health) exactly; a fit
    table's observed means likewise. Older files carry no SE or health figures: no eval SE and no health column then."""
    committed = path.with_name(path.name.removesuffix("-runs.csv") + ".md").read_text()
    headers = [c.strip() for c in committed.splitlines()[2].strip("|").split("|")]
    rows, caption = table_rows(committed), committed.splitlines()[0]
    base = (re.search(r"Δ vs (.+?), best in bold", caption) or re.search(r"ΔA vs (.+?) \[", committed)).group(1)
    if "observed" in headers:  # a sigmoid fit's table: the mean of the runs' last points
        again = table_rows(report_command(runs=path, baseline=base))
        observed = {r[0]: r[headers.index("observed")] for r in rows}
        assert observed == {r[0]: r[1].strip("*").split(" ±")[0] for r in again}
        return
    logged = set(pd.read_csv(path.with_name(path.name.replace("-runs.csv", "-curves.csv")))["metric"])
    extras = [h for h in headers[4:] if h in logged]
    how, k = reduction_of(caption)
    with_stats = "test" in headers
    rebuilt = report_command(runs=path, baseline=base, with_stats=with_stats, extra_metrics=",".join(extras),
                             reduce_by=how, k=k)  # fmt: skip
    again = table_rows(rebuilt)
    width = 9 if with_stats else 4  # arm, mean ± std, n, Δ (test, p, p (Holm), CI, MDE)
    assert [r[:width] for r in again] == [r[:width] for r in rows]
    rebuilt_headers = [c.strip() for c in rebuilt.splitlines()[2].strip("|").split("|")]
    for extra in extras + [h for h in ("eval SE", "health") if h in headers]:
        column, rebuilt_column = headers.index(extra), rebuilt_headers.index(extra)
        assert [r[rebuilt_column] for r in again] == [r[column] for r in rows], extra
    for absent in {"eval SE", "health"} - set(headers):
        assert absent not in rebuilt_headers
