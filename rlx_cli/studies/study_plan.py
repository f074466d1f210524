"""A study declared in one file before its runs: its arms, baseline, metric, margin, α, seeds and design.

```yaml
study: vapo-default                 # the study's name (and its experiment's, unless ``experiment:``)
common: trainer.steps=100           # overrides in every arm (a string of shell words, or a list)
arms:                               # name -> overrides; or ``preset: vapo`` (the preset and each +ablate= overlay
  vapo: algo=vapo                   # that applies to it, as rlx ablate), or ``grid: ['key=a,b', ...]`` (Hydra's
  no_token_loss: algo=vapo +ablate=no_token_loss   # multirun syntax, one arm a point)
baseline: vapo                      # default: the first arm
metric: eval/accuracy_sampled       # the primary metric; ``secondary: [...]`` more columns
margin: 0.02                        # δ, in the metric's units
alpha: 0.05                         # the family-wise level over every look and arm
seeds: 5                            # the first look's seeds (the fixed design's only look)
design: until_decided               # or fixed
every: 5                            # seeds added at each later look
max_seeds: 20                       # the last look
control: true                       # a no-op arm (+ablate=noop); default: on with until_decided
spending: pocock                    # how α is spent over the looks: pocock (default) | obf
```

The first launch stores the plan, with the time it was declared and the code's commit, as ``plan.yaml`` in the
study's folder (and on the study's MLflow parent run); a later launch with another plan for the same study is
refused, so that what a table is judged by is what was declared before its runs.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path

import yaml

from rlx_cli.config.errors import UserError
from rlx_cli.studies.study import STUDY_NAME

DESIGNS = ("fixed", "until_decided")
DIRECTIONS = ("higher", "lower")
CONTROL = ("noop", "+ablate=noop")  # the no-op arm: the baseline's update up to float rounding
KEYS = ("study", "experiment", "description", "common", "arms", "preset", "grid", "baseline", "metric", "secondary",
        "reduce", "margin", "alpha", "direction", "seeds", "design", "every", "max_seeds", "control",
        "spending")  # fmt: skip
SPENDINGS = ("pocock", "obf")  # boundaries.SPENDING
STORED = ("declared", "commit", "source")  # what the stored copy adds
FILE = "plan.yaml"


@dataclass(frozen=True)
class StudyPlan:
    study: str
    arms: dict[str, list[str]]  # name -> its overrides (the common ones included), the baseline first
    baseline: str
    experiment: str = ""
    description: str = ""
    metric: str = "eval/accuracy_sampled"
    secondary: list[str] = field(default_factory=list)
    reduce: str = "last"
    margin: float = 0.02
    alpha: float = 0.05
    direction: str | None = None
    seeds: int = 5
    design: str = "fixed"
    every: int = 5
    max_seeds: int = 20
    control: bool = False
    spending: str = "pocock"  # how α is spent over the looks (boundaries.SPENDING)
    declared: str = ""  # when the first launch stored it (ISO 8601)
    commit: str = ""  # the code's commit at that launch
    source: str = ""  # the file it was read from

    @property
    def looks(self) -> tuple[int, ...]:
        """The seeds per arm at each look: ``seeds``, then ``every`` more up to ``max_seeds`` (fixed: ``seeds``)."""
        if self.design == "fixed":
            return (self.seeds,)
        counts = list(range(self.seeds, self.max_seeds, self.every))
        return (*counts, self.max_seeds)

    @property
    def fractions(self) -> tuple[float, ...]:
        """Each look's information fraction: its seeds over the last look's."""
        return tuple(n / self.looks[-1] for n in self.looks)

    def judged(self) -> dict:
        """What the table is judged by: everything but when and where it was declared."""
        return {k: v for k, v in asdict(self).items() if k not in STORED}


def words(value, key: str) -> list[str]:
    """Overrides as a list: shell words of a string, or a list of strings."""
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise UserError(f"plan key '{key}': {value!r} is not valid (valid: overrides as a string or a list of strings)")


def arms_of(raw: dict, common: list[str]) -> dict[str, list[str]]:
    """The plan's arms from ``arms:``, ``preset:`` or ``grid:`` (exactly one of them)."""
    given = [k for k in ("arms", "preset", "grid") if k in raw]
    if len(given) != 1:
        found = ", ".join(given) or "none"
        raise UserError(f"a plan names its arms with one of arms:, preset:, grid: (found: {found})")
    if "arms" in raw:
        if not isinstance(raw["arms"], dict) or not raw["arms"]:
            raise UserError("plan key 'arms': a mapping of arm name -> overrides (valid: e.g. grpo: algo=grpo)")
        return {str(name): [*common, *words(o, f"arms.{name}")] for name, o in raw["arms"].items()}
    from rlx_cli.studies.grid import applicable_overlays, expand

    if "preset" in raw:
        base = [*common, f"algo={raw['preset']}"]
        return {str(raw["preset"]): base} | {name: [*base, f"+ablate={name}"] for name in applicable_overlays(base)}
    points = expand([*common, *words(raw["grid"], "grid")])
    varying = [t for t in dict.fromkeys(t for p in points for t in p) if any(t not in p for p in points)]
    return {" ".join(t for t in p if t in varying) or "all": p for p in points}


def check(plan: StudyPlan) -> StudyPlan:
    """One clear line for a value out of range."""
    if not STUDY_NAME.match(plan.study):
        raise UserError(f"plan key 'study': '{plan.study}' is not a valid name (valid: letters, digits, '_', '-', '.')")
    bad_names = [a for a in plan.arms if not a.strip() or any(c in a for c in "|\n")]
    if bad_names:
        raise UserError(f"plan arm name {bad_names[0]!r} is not valid (valid: a non-empty name without '|')")
    if plan.baseline not in plan.arms:
        raise UserError(f"plan key 'baseline': '{plan.baseline}' is no arm (valid: {', '.join(plan.arms)})")
    if len(plan.arms) < 2:  # sequential.replay runs seeds only for arms judged against the baseline: none would run
        raise UserError(f"plan key 'arms': only the baseline '{plan.baseline}' (valid: the baseline and an arm to "
                        "judge against it, or control: true for the no-op arm)")  # fmt: skip
    checks = [
        ("design", plan.design in DESIGNS, ", ".join(DESIGNS)),
        ("direction", plan.direction in (None, *DIRECTIONS), ", ".join(DIRECTIONS)),
        ("margin", plan.margin > 0, "> 0, in the metric's units"),
        ("alpha", 0 < plan.alpha < 0.5, "above 0 and below 0.5"),
        ("seeds", plan.seeds >= 2, "2 or more: a test needs two seeds a side"),
        ("every", plan.every >= 1, "1 or more"),
        ("max_seeds", plan.design == "fixed" or plan.max_seeds > plan.seeds, f"more than seeds ({plan.seeds})"),
        ("reduce", plan.reduce in ("last", "max"), "last, max"),
        ("spending", plan.spending in SPENDINGS, ", ".join(SPENDINGS)),
    ]
    for key, ok, valid in checks:
        if not ok:
            raise UserError(f"plan key '{key}': {getattr(plan, key)!r} is not valid (valid: {valid})")
    return plan


def parse(raw: dict, source: str = "") -> StudyPlan:
    """A plan from its YAML mapping; the no-op control arm added when asked (or by default under until_decided)."""
    if not isinstance(raw, dict):
        raise UserError(f"a plan is a YAML mapping (valid keys: {', '.join(KEYS)})")
    unknown = [k for k in raw if k not in (*KEYS, *STORED)]
    if unknown:
        raise UserError(f"unknown plan key '{unknown[0]}' (valid: {', '.join(KEYS)})")
    if "study" not in raw:
        raise UserError("a plan names its study: study: NAME")
    common = words(raw.get("common", []), "common")
    arms = arms_of(raw, common)
    numbers = {}
    for key, kind in (("margin", float), ("alpha", float), ("seeds", int), ("every", int), ("max_seeds", int)):
        if key in raw:
            try:
                numbers[key] = kind(raw[key])
            except (TypeError, ValueError):
                raise UserError(f"plan key '{key}': {raw[key]!r} is not a number") from None
    design = str(raw.get("design", "fixed"))
    plan = StudyPlan(
        study=str(raw["study"]), arms=arms, baseline=str(raw.get("baseline", next(iter(arms)))),
        experiment=str(raw.get("experiment") or raw["study"]), description=str(raw.get("description", "")),
        metric=str(raw.get("metric", StudyPlan.metric)), secondary=[str(m) for m in raw.get("secondary", [])],
        reduce=str(raw.get("reduce", "last")), direction=raw.get("direction"), design=design,
        control=bool(raw.get("control", design == "until_decided")), spending=str(raw.get("spending", "pocock")),
        declared=str(raw.get("declared", "")),
        commit=str(raw.get("commit", "")), source=str(raw.get("source") or source), **numbers,
    )  # fmt: skip
    return check(with_control(plan))


def with_control(plan: StudyPlan) -> StudyPlan:
    """The plan with its no-op arm (the baseline's overrides + ``+ablate=noop``) when ``control`` asks for one."""
    name, overlay = CONTROL
    if not plan.control or name in plan.arms:
        return plan
    return replace(plan, arms={**plan.arms, name: [*plan.arms[plan.baseline], overlay]})


def load(path: Path, **changes) -> StudyPlan:
    """The plan in ``path`` (YAML), with command-line ``changes`` (design, max_seeds, every, control) applied."""
    if not path.is_file():
        raise UserError(f"--plan {path}: no such file (valid: a study plan, YAML: docs/studies-and-reports.md)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0]
        raise UserError(f"--plan {path}: not valid YAML ({first})") from None
    raw = {**(raw or {}), **{k: v for k, v in changes.items() if v is not None}}
    return parse(raw, str(path))


def dumped(plan: StudyPlan) -> str:
    data = asdict(plan)
    data["arms"] = {name: shlex.join(o) for name, o in plan.arms.items()}
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def stored(folder: Path) -> StudyPlan | None:
    path = folder / FILE
    if not path.is_file():
        return None
    raw = yaml.safe_load(path.read_text())
    raw["arms"] = {name: shlex.split(o) for name, o in raw["arms"].items()}
    return StudyPlan(**raw)


def declare(plan: StudyPlan, folder: Path, commit: str, *, carried: bool = False) -> StudyPlan:
    """Store ``plan`` in the study's folder at its first launch; at a later one, the stored plan (refused if the
    judging or the arms changed: a new plan is a new study). ``carried``: the study's earlier runs come from another
    store, so a stored copy (``plan`` with ``declared``) keeps when and at which commit it was first declared."""
    before = stored(folder)
    if before is None:
        if not (carried and plan.declared):
            plan = replace(plan, declared=datetime.now().astimezone().isoformat(timespec="seconds"), commit=commit)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / FILE).write_text(dumped(plan))
        return plan
    old, new = before.judged(), plan.judged()
    changed = [k for k in new if old.get(k) != new[k]]
    if changed:
        key = changed[0]
        raise UserError(f"study '{plan.study}' was declared on {before.declared} with {key} = {old.get(key)!r}, not "
                        f"{new[key]!r} (valid: the declared plan, {folder / FILE}; a new plan is a new study: "
                        "change study:)")  # fmt: skip
    return before


def describe(plan: StudyPlan) -> str:
    """The design in words, for a table's footer."""
    if plan.design == "fixed":
        return f"fixed design: {plan.seeds} seeds an arm, α = {plan.alpha:g}, δ = {plan.margin:g}"
    looks = ", ".join(map(str, plan.looks))
    kind = {"pocock": "Pocock", "obf": "O'Brien-Fleming"}[plan.spending]
    return (
        f"until decided: looks at {looks} seeds an arm, {kind}-type Lan-DeMets spending of α = {plan.alpha:g} over "
        f"the looks with Holm-Shaffer over the arms, δ = {plan.margin:g}"
    )
