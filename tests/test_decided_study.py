"""A declared study run by ``rlx sweep --plan FILE --until-decided`` end to end on the tiny default: looks, decided
arms that stop, the no-op control, the table, a relaunch that runs nothing, ``rlx status`` and a changed plan."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import SHORT, mlflow_runs, rlx, rlx_here, table_rows

pytestmark = pytest.mark.slow

PLAN = """\
study: decided
common: {common}
arms:
  grpo: algo=grpo
  clip_higher: algo=grpo policy_loss.eps_high=0.28
  fast: algo=grpo trainer.lr=3e-3
metric: eval/accuracy
margin: {margin}
seeds: 2
every: 1
max_seeds: 3
design: until_decided
"""


def test_a_study_decided_look_by_look(workdir):
    plan = workdir / "plan.yaml"
    plan.write_text(PLAN.format(common=" ".join(SHORT), margin=0.02))
    first = rlx("sweep", "--plan", str(plan), "--jobs", "2", cwd=workdir)
    assert first.returncode == 0, first.stdout + first.stderr
    # look 1 (2 seeds): the clip that never binds and the no-op are identical to the baseline and stop there; the
    # fast arm cannot be told from 2 seeds (1 df) and runs a third at look 2, with the baseline: 2 x 4 + 2 runs
    assert "2 of 2 looks done" in first.stdout
    folder = workdir / "outputs" / "sweeps" / "decided"
    table = pd.read_csv(folder / "table.csv", keep_default_na=False).set_index("arm")
    assert (
        table.loc["clip_higher", "verdict"] == "identical"
        and table.loc["clip_higher", "decided_at"] == "look 1 (2 seeds)"
    )
    assert table.loc["noop", "verdict"] == "identical" and table.loc["noop", "n"] == 2
    assert table.loc["fast", "n"] == 3 and table.loc["grpo", "n"] == 3 and table.loc["fast", "decided_at"] == ""
    text = (folder / "table.md").read_text()
    headers = [c.strip() for c in text.splitlines()[2].strip("|").split("|")]
    cells = {r[0]: r for r in table_rows(text)}
    said = cells["fast"][headers.index("verdict")]
    assert said in ("inconclusive (at 3 seeds, the last look)", "better", "worse", "equivalent"), said
    assert "until decided: looks at 2, 3 seeds an arm, Pocock-type" in text
    assert "pairing by seed holds" in text and "runs spent: 10" in text and "decided at" in text
    runs = trained(workdir)
    assert sorted(runs["tags.rlx.arm"]) == sorted(["grpo"] * 3 + ["fast"] * 3 + ["clip_higher"] * 2
                                                                  + ["noop"] * 2)  # fmt: skip
    # the same command again: judged from what FINISHED, nothing run twice
    again = rlx_here("sweep", "--plan", str(plan), "--jobs", "2", cwd=workdir)  # no worker to start: in this process
    assert again.returncode == 0 and "to run" not in again.stdout and len(trained(workdir)) == 10
    status = rlx_here("status", "--study", "decided", cwd=workdir)
    assert "plan: until decided: looks at 2, 3" in status.stdout and "decided at look 1: identical" in status.stdout
    # what was declared judges the table: another margin is another study
    plan.write_text(PLAN.format(common=" ".join(SHORT), margin=0.05))
    changed = rlx_here("sweep", "--plan", str(plan), cwd=workdir)
    assert changed.returncode == 2 and "was declared on" in changed.stderr and "margin = 0.02" in changed.stderr
    report = rlx_here("report", "--study", "decided", "--margin", "0.05", cwd=workdir)
    assert report.returncode == 2 and "was declared with margin 0.02, not 0.05" in report.stderr


def trained(workdir):
    """The study's training runs (not the run of the study itself, tag rlx.role=study)."""
    runs = mlflow_runs(workdir, "decided")
    return runs[runs["tags.rlx.role"] != "study"]
