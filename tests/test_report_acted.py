"""The ``acted`` column of a declared study rebuilt from its per-run data (``rlx report --runs FILE --plan PLAN``),
and a declared study's table before its first look."""

from __future__ import annotations

import io

import pandas as pd

from rlx_cli.studies import run_records
from rlx_cli.studies.report import report_command
from rlx_cli.studies.run_records import RunRecord

PLAN = """study: t
arms:
  vapo: algo=vapo
  no_adaptive_gae: algo=vapo +ablate=no_adaptive_gae
metric: eval/accuracy
seeds: 5
design: until_decided
"""
# arm -> (its runs' λ range (min, max) over steps, final greedy accuracy of seeds 0, 1, 2): three of five seeds run
RUNS = {"vapo": ((0.15, 0.93), (0.2, 0.1, 0.15)), "no_adaptive_gae": ((0.95, 0.95), (0.25, 0.2, 0.2))}


def runs_file(folder):
    """The runs as ``rlx report --out`` writes them (``run_records.write``), the plan beside them."""
    records = []
    for arm, ((low, high), values) in RUNS.items():
        for seed, value in enumerate(values):
            record = RunRecord(arm, str(seed), f"{arm}-{seed}", "FINISHED", value, se=0.02)
            record.acted |= {"train/policy_lam_max mean": high, "train/policy_lam_min mean": low}
            records.append(record)
    (folder / "plan.yaml").write_text(PLAN)
    return run_records.write(records, "eval/accuracy", folder / "t-runs.csv")


def test_a_plan_arms_ablation_is_read_from_the_plan_so_its_acted_figure_comes_back(tmp_path):
    path = runs_file(tmp_path)
    text = report_command(runs=path, plan=tmp_path / "plan.yaml", fmt="csv")
    by_arm = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False).set_index("arm").to_dict("index")
    # the preset's λ spans 0.93 - 0.15 = 0.78 on every run; the ablation's fixed λ spans nothing
    assert by_arm["no_adaptive_gae"]["acted"] == "spread of the per-row λ: 0.78 → 0"
    assert by_arm["vapo"]["acted"] == ""


def test_a_declared_study_before_its_first_look_is_tabled_with_its_evaluation_noise(tmp_path):
    path = runs_file(tmp_path)
    text = report_command(runs=path, plan=tmp_path / "plan.yaml")
    assert "inconclusive (running: look 1 of" in text and "eval SE" in text
