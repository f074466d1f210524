"""Rebuild the committed tables from their per-run data, with today's code: every ``T.md`` beside a ``T-runs.csv``
and every ``*-verdicts.md`` (which names its runs file under the table).

    python reports/rebuild.py            # rewrite the tables whose text changed, print their paths
    python reports/rebuild.py --check    # exit 1 and list them instead (tests/test_committed_tables.py runs this)

A table is what ``rlx report --runs T-runs.csv`` prints with the options its caption states (the metric, how a run
became one number, the baseline, the margin, α and the direction of its verdicts, the extra columns that the
``T-curves.csv`` beside it holds). What only the MLflow store knew when the table was written is kept from the
committed file: the caption's reduction and budget in words ("last up to samples = 12,800"), the line naming the
experiment and the common overrides, and the columns computed from curves the runs file does not hold (the AUC at
equal compute, the samples drawn), cells and legend as they were. A declared study's table (a "declared …" line under
it) is judged by the plan beside its data (``plan.yaml``, the copy stored at its first launch). Everything else
(means, tests, verdicts, intervals, seeds to decide, eval SE, health, the notes and the legend) comes from the code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

from rlx_cli.studies import report_format, report_read
from rlx_cli.studies.report import Request, tabulate

REPORTS = Path(__file__).resolve().parent
CAPTION = re.compile(
    r"^(?P<metric>\S+) \((?P<reduce>.+?) per run\): mean ± std over seeds, \d+ arms?, Δ vs (?P<base>.+?), best in bold"
    r"(?:; verdicts at α = (?P<alpha>[\d.]+) against a margin δ = (?P<margin>[\d.]+) in .+?'s units, "
    r"(?P<direction>lower|higher) is better)?(?:; (?P<budget>.+))?$"
)


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parts(text: str) -> tuple[re.Match, list[str], list[list[str]], list[str], dict[str, str]]:
    """A committed table -> (its caption's fields, headers, rows, notes, legend)."""
    lines = text.splitlines()
    caption = CAPTION.match(lines[0])
    end = lines.index("", 2)
    headers, rows = cells(lines[2]), [cells(line) for line in lines[4:end]]
    columns = lines.index("Columns:")
    notes = [line for line in lines[end:columns] if line]
    legend = dict(line[2:].split(": ", 1) for line in lines[columns + 1 :] if line.startswith("- "))
    return caption, headers, rows, notes, legend


def runs_file(path: Path, notes: list[str]) -> Path:
    if path.name.endswith("-verdicts.md"):
        named = next(line for line in notes if line.startswith("runs "))[len("runs ") :]
        return REPORTS.parent / named
    return path.with_name(path.stem + "-runs.csv")


EXTRA = re.compile(r"^(last|max|mean of the last (\d+)|mean of the first (\d+)) per run of its curve in ")


def reduction(words: str) -> tuple[str, int]:
    """``--reduce`` and ``--k`` from a caption's or a legend's words ("last", "mean of the last 20", ...)."""
    for how, pattern in (("mean_last_k", r"mean of the last (\d+)"), ("mean_first_k", r"mean of the first (\d+)")):
        found = re.match(pattern, words)
        if found:
            return how, int(found.group(1))
    return ("max" if words.startswith("max") else "last"), 3


def rebuilt(path: Path) -> str:
    """The table at ``path`` as today's code writes it from its per-run data."""
    caption, headers, rows, notes, legend = parts(path.read_text())
    runs = runs_file(path, notes)
    logged = set(pd.read_csv(runs.with_name(runs.name.replace("-runs.csv", "-curves.csv")))["metric"])
    tail = headers[headers.index("Δ") + 1 :]
    extras = [h for h in tail if h in logged]
    kept = [h for h in tail if h not in logged and (h.startswith("AUC of ") or h == "samples drawn")]
    said = next((legend[e] for e in extras if EXTRA.match(legend.get(e, ""))), caption["reduce"])  # a --runs table's
    how, k = reduction(said)  # extras say how they were reduced; a store table's reduced as its metric
    with_stats = "test" in headers  # tables from before verdicts existed have the tests alone: judged now
    margin, alpha = (float(caption[key]) if caption[key] else None for key in ("margin", "alpha"))
    declared = any(n.startswith("declared ") for n in notes)  # a declared study's: judged by its plan beside the data
    plan = runs.parent / "plan.yaml" if declared else None
    request = Request(runs=runs, baseline=caption["base"], extras=tuple(extras), reduce_by=how, k=k,
                      with_stats=with_stats, margin=None if plan else margin, alpha=None if plan else alpha,
                      direction=None if plan else caption["direction"], plan=plan)  # fmt: skip
    tabled = tabulate(report_read.from_file(request), request)
    context = tabled.context
    context.reduce, context.budget = caption["reduce"], caption["budget"] or ""
    source = next((n for n in notes if n.startswith(("experiment ", "study ", "runs "))), "")
    context.source, _, context.common = source.partition(" · common overrides: ")
    layout = report_format.ablation(tabled.frame, context)
    by_arm = {row[0]: row for row in rows}
    for name in kept:  # computed by the store from curves the runs file does not hold: as committed
        layout.headers.append(name)
        layout.legend.append((name, legend[name]))
        for line in layout.rows:
            line.append(by_arm[line[0]][headers.index(name)])
    return report_format.markdown(layout)


def committed() -> list[Path]:
    tables = [p.with_name(p.name.removesuffix("-runs.csv") + ".md") for p in REPORTS.rglob("*-runs.csv")]
    tables = [t for t in tables if t.is_file() and CAPTION.match(t.read_text().splitlines()[0])]
    return sorted(tables + list(REPORTS.rglob("*-verdicts.md")))


def main(argv: list[str]) -> int:
    changed = [path for path in committed() if rebuilt(path) != path.read_text()]
    for path in changed:
        print(path.relative_to(REPORTS.parent))
        if "--check" not in argv:
            path.write_text(rebuilt(path))
    return 1 if changed and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
