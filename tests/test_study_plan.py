"""Study plans (``rlx_cli/studies/study_plan.py``): every committed plan parses, names its arms once, judges against
one of them and composes; and the plan file's rules on hand-written YAML."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from rlx_cli.config.errors import UserError
from rlx_cli.studies import study_plan
from rlx_cli.studies.deciding import arm_points
from rlx_cli.studies.grid import CONTROLS

REPORT_PLANS = sorted((REPO / "reports").rglob("plan*.yaml"))
BUILT_IN = sorted((REPO / "conf" / "study").glob("*.yaml"))
PLANS = [*REPORT_PLANS, *BUILT_IN]
IDS = [str(p.relative_to(REPO)) for p in PLANS]


class Unique(yaml.SafeLoader):
    """YAML that refuses a key given twice (safe_load keeps the last: two arms of one name would be one)."""


def no_duplicates(loader, node, deep=False):
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    twice = sorted({str(k) for k in keys if keys.count(k) > 1})
    if twice:
        raise yaml.constructor.ConstructorError(None, None, f"given twice: {', '.join(twice)}", node.start_mark)
    return loader.construct_mapping(node, deep)


Unique.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, no_duplicates)


def test_every_committed_study_has_its_plans():
    """Every report with runs of its own has a plan beside its data, and no run script is left to run it."""
    assert len(REPORT_PLANS) >= 25 and len(BUILT_IN) >= 1
    beside = {p.relative_to(REPO / "reports").parts[0] for p in REPORT_PLANS}
    assert beside == {p.stem for p in (REPO / "reports").glob("*.md")}
    assert not [*(REPO / "reports").rglob("*.sh"), *(REPO / "scripts").glob("run_arms.sh")]


@pytest.mark.parametrize("path", PLANS, ids=IDS)
def test_a_committed_plan_parses_with_unique_arms_and_its_baseline_among_them(path):
    raw = yaml.load(path.read_text(), Loader=Unique)  # a key twice raises here
    plan = study_plan.load(path)
    if "arms" in raw:  # the names as written, in order (a control arm after them)
        assert list(plan.arms)[: len(raw["arms"])] == list(raw["arms"])
    assert plan.baseline in plan.arms and len(plan.arms) >= 2
    if path in REPORT_PLANS:  # a fixed design of 2-5 seeds, or until decided from 5; each says how to run it again
        fixed = plan.design == "fixed" and plan.seeds in (2, 3, 5)
        assert plan.margin == 0.02 and (fixed or (plan.design == "until_decided" and plan.seeds >= 5))
        assert f"rlx sweep --plan {path.relative_to(REPO)} --jobs" in path.read_text().split("\nstudy:")[0]


def test_each_committed_study_has_its_own_name():
    """Two plans of one name would refuse each other (``declare``); an experiment may hold two studies."""
    names = [study_plan.load(p).study for p in PLANS]
    assert len(names) == len(set(names)), names


def widest(plan: study_plan.StudyPlan) -> study_plan.StudyPlan:
    """The plan cut to the arm with the most overrides, the likeliest to break (a compose takes ~0.3 s)."""
    arm = max(plan.arms, key=lambda a: len(plan.arms[a]))
    return replace(plan, arms={arm: plan.arms[arm]}, baseline=arm)


@pytest.mark.parametrize("path", PLANS, ids=IDS)
def test_a_committed_plans_arms_compose_and_validate(path):
    """A built-in plan's every arm; a report plan's widest (all 193 arms take ~1 min: the slow test below)."""
    plan = study_plan.load(path)
    plan = plan if path in BUILT_IN else widest(plan)
    points = arm_points(plan)
    assert list(points) == list(plan.arms)
    assert {p.experiment for p in points.values()} == {plan.experiment}


@pytest.mark.slow
@pytest.mark.parametrize("path", REPORT_PLANS, ids=IDS[: len(REPORT_PLANS)])
def test_every_arm_of_a_report_plan_composes(path):
    plan = study_plan.load(path)
    assert list(arm_points(plan)) == list(plan.arms)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


TWO = "study: s\narms:\n  grpo: algo=grpo\n  ppo: algo=ppo\n"


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(UserError) as caught:
        study_plan.load(write(tmp_path, text))
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_unknown_key_is_refused_in_one_line_naming_the_valid_keys(tmp_path):
    message = refused(tmp_path, TWO + "seed: 3\n")
    assert message.startswith("unknown plan key 'seed' (valid: ")
    assert message.endswith(f"(valid: {', '.join(study_plan.KEYS)})")


def test_a_baseline_that_is_no_arm_is_refused_naming_the_arms(tmp_path):
    message = refused(tmp_path, TWO + "baseline: rloo\n")
    assert message == "plan key 'baseline': 'rloo' is no arm (valid: grpo, ppo)"
    assert study_plan.load(write(tmp_path, TWO)).baseline == "grpo"  # default: the first arm


def test_a_plan_of_its_baseline_alone_is_refused_unless_it_adds_the_control(tmp_path):
    """``rlx sweep --plan`` runs seeds for the arms judged against the baseline: with none, nothing would run."""
    one = "study: s\narms:\n  grpo: algo=grpo\n"
    assert refused(tmp_path, one).startswith("plan key 'arms': only the baseline 'grpo' (valid: ")
    assert list(study_plan.load(write(tmp_path, one + "control: true\n")).arms) == ["grpo", "noop"]


@pytest.mark.parametrize(
    ("line", "key"),
    [("design: sequential", "design"), ("margin: 0", "margin"), ("margin: -0.02", "margin"), ("alpha: 0", "alpha"),
     ("alpha: 0.5", "alpha"), ("alpha: 1.2", "alpha"), ("seeds: 1", "seeds"), ("spending: linear", "spending"),
     ("reduce: mean", "reduce"), ("direction: up", "direction")],
)  # fmt: skip
def test_a_value_out_of_range_is_refused_naming_its_key(tmp_path, line, key):
    assert re.fullmatch(rf"plan key '{key}': \S+ is not valid \(valid: .+\)", refused(tmp_path, f"{TWO}{line}\n"))


def test_values_in_range_are_kept(tmp_path):
    plan = study_plan.load(write(tmp_path, TWO + "margin: 0.01\nalpha: 0.1\nseeds: 2\ndesign: until_decided\n"))
    assert (plan.margin, plan.alpha, plan.seeds, plan.design) == (0.01, 0.1, 2, "until_decided")


def test_a_preset_is_its_arm_and_each_overlay_that_applies_to_it_as_rlx_ablate_runs_them(tmp_path):
    plan = study_plan.load(write(tmp_path, "study: s\ncommon: task=long_sums trainer.steps=40\npreset: vapo\n"))
    base = ["task=long_sums", "trainer.steps=40", "algo=vapo"]
    overlays = sorted(p.stem for p in (REPO / "conf" / "ablate").glob("*.yaml") if p.stem not in CONTROLS)
    assert len(overlays) == 7  # every ingredient's overlay applies to VAPO; the controls are no arm
    assert plan.arms == {"vapo": base} | {name: [*base, f"+ablate={name}"] for name in overlays}
    assert plan.baseline == "vapo"


def test_a_grid_is_an_arm_a_point_named_by_what_varies(tmp_path):
    text = "study: s\ncommon: [task=long_sums]\ngrid: ['algo=grpo,ppo', 'trainer.steps=20,40', eval.samples=4]\n"
    plan = study_plan.load(write(tmp_path, text))
    names = ["algo=grpo trainer.steps=20", "algo=grpo trainer.steps=40", "algo=ppo trainer.steps=20",
             "algo=ppo trainer.steps=40"]  # fmt: skip
    assert list(plan.arms) == names
    assert plan.arms[names[2]] == ["task=long_sums", "algo=ppo", "trainer.steps=20", "eval.samples=4"]
    assert refused(tmp_path, TWO + "grid: ['algo=grpo,ppo']\n").startswith("a plan names its arms with one of")


def test_the_control_arm_is_added_under_until_decided_and_when_asked(tmp_path):
    until = study_plan.load(write(tmp_path, TWO + "baseline: ppo\ndesign: until_decided\n"))
    assert list(until.arms) == ["grpo", "ppo", "noop"] and until.control
    assert until.arms["noop"] == ["algo=ppo", "+ablate=noop"]  # the baseline's update up to float rounding
    assert "noop" not in study_plan.load(write(tmp_path, TWO)).arms  # fixed: none by default
    assert "noop" not in study_plan.load(write(tmp_path, TWO + "design: until_decided\ncontrol: false\n")).arms
    assert study_plan.load(write(tmp_path, TWO), design="until_decided").arms["noop"] == ["algo=grpo", "+ablate=noop"]


def test_a_plan_is_stored_at_its_first_launch_read_back_and_a_changed_one_refused(tmp_path):
    folder = tmp_path / "study"
    assert study_plan.stored(folder) is None
    plan = study_plan.load(write(tmp_path, TWO + "common: \"trainer.steps=40 'task.config={a: 1}'\"\nseeds: 4\n"))
    first = study_plan.declare(plan, folder, "abc1234")
    assert first.commit == "abc1234" and first.declared and (folder / study_plan.FILE).is_file()
    back = study_plan.stored(folder)
    assert back == first and back.arms["ppo"] == ["trainer.steps=40", "task.config={a: 1}", "algo=ppo"]
    assert study_plan.declare(plan, folder, "def5678") == first  # the same plan: the stored one, as declared
    with pytest.raises(UserError) as caught:
        study_plan.declare(replace(plan, margin=0.03), folder, "def5678")
    message = str(caught.value)
    assert "\n" not in message and f"declared on {first.declared} with margin = 0.02, not 0.03" in message
    with pytest.raises(UserError, match=r"with arms = \{.*'ppo'.*\}, not \{'grpo'"):
        study_plan.declare(replace(plan, arms={"grpo": ["algo=grpo"], "rloo": ["algo=rloo"]}), folder, "x")


def test_a_carried_plan_keeps_when_it_was_first_declared(tmp_path):
    plan = replace(study_plan.load(write(tmp_path, TWO)), declared="2026-11-28T20:26:46+00:00", commit="865906c")
    assert study_plan.declare(plan, tmp_path / "new", "abc1234", carried=True) == plan
    assert study_plan.declare(plan, tmp_path / "fresh", "abc1234").commit == "abc1234"  # not carried: declared now


def earlier_runs(tmp_path: Path, rows: list[tuple[str, int, float]], metric: str = study_plan.StudyPlan.metric):
    path = tmp_path / "table-runs.csv"
    lines = [f"arm,seed,run_id,{metric},status"] + [f"{a},{s},r{a}{s},{v},FINISHED" for a, s, v in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_study_resumed_from_runs_of_another_store_runs_only_the_seeds_they_lack(tmp_path, capsys):
    """``rlx sweep --plan P --runs FILE``: look 1 (2 seeds) is in the file, ppo undecided -> look 2's seeds 2, 3 of
    the baseline and of ppo; with ppo's seed 1 and the no-op's missing, look 1 is not complete and those alone run."""
    from rlx_cli.studies.deciding import plan_command

    path = write(tmp_path, TWO + "seeds: 2\nevery: 2\nmax_seeds: 4\n")
    looked = [("grpo", 0, 0.5), ("grpo", 1, 0.6), ("ppo", 0, 0.55), ("ppo", 1, 0.45), ("noop", 0, 0.5),
              ("noop", 1, 0.6)]  # fmt: skip
    assert plan_command(path, until_decided=True, dry_run=True, runs=earlier_runs(tmp_path, looked)) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "rlx sweep --plan: 1 of 2 looks done; decided: noop identical at look 1; running: ppo"
    assert said[1].endswith(": 4 runs") and said[2:] == [f"  {a} seed {s}" for a in ("grpo", "ppo") for s in (2, 3)]
    assert plan_command(path, until_decided=True, dry_run=True, runs=earlier_runs(tmp_path, looked[:3])) == 0
    head = f"rlx sweep --plan: the next look, beside the 3 runs in {tmp_path / 'table-runs.csv'}: 3 runs"
    assert capsys.readouterr().out.splitlines()[1:] == [head, "  ppo seed 1", "  noop seed 0", "  noop seed 1"]


def test_runs_of_another_study_are_refused_naming_what_fits(tmp_path):
    from rlx_cli.studies.deciding import earlier_values

    plan = study_plan.load(write(tmp_path, TWO))
    with pytest.raises(UserError, match=r"arm 'rloo' is not in the plan \(valid: grpo, ppo\)$"):
        earlier_values(earlier_runs(tmp_path, [("grpo", 0, 0.5), ("rloo", 0, 0.4)]), plan)
    with pytest.raises(UserError, match=r"hold train/reward, the plan judges eval/accuracy_sampled \(valid: the \*-"):
        earlier_values(earlier_runs(tmp_path, [("grpo", 0, 0.5)], "train/reward"), plan)
