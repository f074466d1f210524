"""A report's arms: tracked runs grouped by their overrides minus the seed, labelled by what differs between them;
the baseline and the arms a report names (``--baseline``, ``--arm``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx_cli.config.errors import UserError
from rlx_cli.studies.study import SEED_KEY, canonical_tokens, key_of, override_tokens, quoted


@dataclass
class Arm:
    tokens: list[str]  # the overrides without the seed, sorted
    algo: str
    ablate: str
    runs: list = field(default_factory=list)  # mlflow Run objects, one per seed: the FINISHED ones
    label: str = ""
    failed: list = field(default_factory=list)  # FAILED runs of seeds without a FINISHED run (health flags only)

    @property
    def key(self) -> str:
        """Its overrides as one command line's words."""
        return " ".join(map(quoted, self.tokens))


def ablation_of(tokens) -> str:
    """The ``+ablate=`` overlay among an arm's override ``tokens`` ("none" without one)."""
    return next((t.split("=", 1)[1] for t in tokens if t.startswith("+ablate=")), "none")


def algo_of(tokens) -> str:
    """The ``algo=`` preset among an arm's override ``tokens`` ("?" without one)."""
    return next((t.split("=", 1)[1] for t in tokens if t.startswith("algo=")), "?")


def group_arms(runs: list, failed: list = ()) -> list[Arm]:
    """Arms by overrides minus the seed, in the order they started; labels name what differs between them. A
    ``failed`` run joins its arm's ``failed`` where the arm has no FINISHED run of its seed (an arm all of whose
    runs failed comes last)."""
    arms: dict[str, Arm] = {}
    for run, done in [(r, True) for r in sorted(runs, key=started)] + [(r, False) for r in sorted(failed, key=started)]:
        tags = run.data.tags
        tokens = [t for t in canonical_tokens(tags["rlx.overrides"]) if key_of(t) != SEED_KEY]
        arm = arms.setdefault("\0".join(tokens), Arm(tokens, tags.get("rlx.algo", "?"), tags.get("rlx.ablate", "none")))
        seed = seed_of(run)
        if done:
            arm.runs = [r for r in arm.runs if seed_of(r) != seed] + [run]  # a re-run replaces
        elif seed not in {seed_of(r) for r in arm.runs}:
            arm.failed = [r for r in arm.failed if seed_of(r) != seed] + [run]
    return labelled(list(arms.values()))


def started(run) -> int:
    return run.info.start_time


def seed_of(run) -> str:
    return run.data.tags.get("rlx.seed", "?")


def common_tokens(arms: list[Arm]) -> set[str]:
    """The override tokens every arm has."""
    return set.intersection(*(set(a.tokens) for a in arms))


def labelled(found: list[Arm]) -> list[Arm]:
    """``found`` with each arm's label: its algorithm, ablation and the overrides that differ between these arms."""
    common = common_tokens(found)
    seen: dict[str, int] = {}
    for arm in found:
        differing = [t for t in arm.tokens if t not in common and key_of(t) not in ("algo", "ablate")]
        ablate = [] if arm.ablate == "none" else [f"+ablate={arm.ablate}"]
        label = " ".join([arm.algo, *ablate, *map(quoted, differing)])
        seen[label] = seen.get(label, 0) + 1
        arm.label = label if seen[label] == 1 else f"{label} #{seen[label]}"
    return found


def common_overrides(arms: list[Arm]) -> str:
    common = common_tokens(arms)
    return " ".join(quoted(t) for t in arms[0].tokens if t in common)


def default_baseline(arms: list[Arm]) -> Arm:
    """The baseline when ``--baseline`` is not given: the first arm without ablation (else the first arm)."""
    return next((a for a in arms if a.ablate == "none"), arms[0])


def pick_arm(arms: list[Arm], name: str, option: str) -> Arm:
    """The one arm ``name`` names: its label, or overrides (and the algorithm) that single it out."""
    exact = [a for a in arms if a.label == name]
    wanted = set(override_tokens(name))
    matches = exact or [a for a in arms if wanted <= set(a.tokens) | {a.algo, a.label}]
    if len(matches) != 1:
        labels = "; ".join(a.label for a in arms)
        raise UserError(f"{option} '{name}' matches {len(matches)} arms (valid: {labels})")
    return matches[0]


def only_arms(arms: list[Arm], names: list[str] | None, base: Arm | None) -> list[Arm]:
    """``--arm`` (repeatable): just the arms named and ``base``, in the order they started, labelled against each
    other. Names are matched against the labels of the whole study, as ``--baseline`` is."""
    if not names:
        return arms
    chosen = {id(pick_arm(arms, name, "--arm")) for name in names} | ({id(base)} if base else set())
    return labelled([a for a in arms if id(a) in chosen])
