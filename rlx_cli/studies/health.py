"""Health flags of a study's arms: runs whose numbers a table should not rank without a word.

A flag sits beside an arm's verdict and never hides it; the arms flagged are listed under the table with the figures
that raised the flag. Each is read from a run's own curves (``figures``), and the thresholds live here, once:

- ``collapsed``: the final greedy (``eval/accuracy``) or sampled accuracy (``eval/accuracy_sampled``) below the run's
  own first (step-0) value by more than ``COLLAPSE_SE`` standard errors of that difference, sqrt(SE_start² + SE_end²)
  from ``eval/*_se``, on at least half of the arm's seeds (runs that did not log the SEs are not judged);
- ``diverged``: a FAILED run of a seed the arm has no FINISHED run of, or a run whose NaN guard skipped an update
  (``train/skipped_steps`` above 0 at its end), on any seed;
- ``entropy-collapse``: ``train/entropy`` at the end under ``ENTROPY_FLOOR`` (10%) of its start, on at least half of
  the seeds;
- ``drift``: ``train/rollout_kl`` (the sampler against the trainer) or ``train/kl`` (the policy against its reference,
  per token, k3) at the end over ``DRIFT``'s threshold, on at least half of the seeds.

A curve's start and end are the mean of its first and last ``POINTS`` points for the noisy per-step entropy and KL,
its first and last point for the evaluations and the skipped updates (a count).
"""

from __future__ import annotations

import math

COLLAPSE_SE = 2.0
ENTROPY_FLOOR = 0.1
DRIFT = {"train/rollout_kl": 0.1, "train/kl": 0.5}
POINTS = 3
ACCURACIES = ("eval/accuracy", "eval/accuracy_sampled")
FLAGS = ("collapsed", "diverged", "entropy-collapse", "drift")

# the per-run figures the flags read: the columns of a report's *-runs.csv
FIGURES = (
    *(f"{m}{se} {end}" for m in ACCURACIES for se in ("", "_se") for end in ("start", "end")),
    "train/entropy start",
    "train/entropy end",
    *(f"{m} end" for m in DRIFT),
    "train/skipped_steps end",
)
METRICS = (*ACCURACIES, *(f"{m}_se" for m in ACCURACIES), "train/entropy", *DRIFT, "train/skipped_steps")

NAN = float("nan")


def figures(curves: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """One run's ``FIGURES`` from its step curves (metric -> [(step, value)]); NaN where it did not log one."""
    out = dict.fromkeys(FIGURES, NAN)
    for metric, points in curves.items():
        values = [v for _, v in points]
        if not values:
            continue
        n = POINTS if metric == "train/entropy" or metric in DRIFT else 1  # noisy per-step curves: a few points
        for end, part in (("start", values[:n]), ("end", values[-n:])):
            if f"{metric} {end}" in out:
                out[f"{metric} {end}"] = sum(part) / len(part)
    return out


def run_flags(status: str, figure: dict[str, float]) -> dict[str, str]:
    """The flags one run raises -> flag: the figures that raised it, in words."""
    if status == "FAILED":
        return {"diverged": "FAILED"}
    out = {}
    for metric in ACCURACIES:
        start, end = figure[f"{metric} start"], figure[f"{metric} end"]
        noise = COLLAPSE_SE * math.hypot(figure[f"{metric}_se start"], figure[f"{metric}_se end"])
        if start - end > noise:  # NaN (no SE logged) compares false: not judged
            out.setdefault("collapsed", f"{metric} {start:.3f} → {end:.3f} ({COLLAPSE_SE:g} SE = {noise:.3f})")
    if figure["train/skipped_steps end"] > 0:
        out["diverged"] = f"the NaN guard skipped {figure['train/skipped_steps end']:.0f} updates"
    start, end = figure["train/entropy start"], figure["train/entropy end"]
    if end < ENTROPY_FLOOR * start:
        out["entropy-collapse"] = f"train/entropy {start:.3g} → {end:.3g} (< {ENTROPY_FLOOR:.0%} of its start)"
    for metric, threshold in DRIFT.items():
        if figure[f"{metric} end"] > threshold:
            out.setdefault("drift", f"{metric} {figure[f'{metric} end']:.3g} (> {threshold:g})")
    return out


def arm_flags(runs: list[tuple[str, str, dict[str, float]]]) -> dict[str, list[str]]:
    """An arm's flags from its runs ``(seed, status, figures)`` -> flag: "seed S: <figures>" of each run that raised
    it; ``diverged`` on any run, the others on at least half of the FINISHED runs."""
    raised: dict[str, list[str]] = {}
    for seed, status, figure in runs:
        for flag, detail in run_flags(status, figure).items():
            raised.setdefault(flag, []).append(f"seed {seed}: {detail}")
    finished = sum(status != "FAILED" for _, status, _ in runs)
    return {f: raised[f] for f in FLAGS if f in raised and (f == "diverged" or 2 * len(raised[f]) >= finished)}


def cell(flags: dict[str, list[str]], runs: list[tuple[str, str, dict[str, float]]]) -> str:
    """The health column: the arm's flags, else ``ok``, or ``not judged`` where a FINISHED run logged no evaluation
    SE (``collapsed`` cannot be read then)."""
    if flags:
        return ", ".join(flags)
    blind = any(status != "FAILED" and all(math.isnan(f[f"{m}_se end"]) for m in ACCURACIES) for _, status, f in runs)
    return "not judged" if blind else "ok"


def judged(runs: list[tuple[str, str, dict[str, float]]]) -> bool:
    """Whether anything the flags read is known of these runs (older reports' runs.csv carry no figures)."""
    return any(status == "FAILED" or any(not math.isnan(v) for v in f.values()) for _, status, f in runs)


def listing(flagged: dict[str, dict[str, list[str]]]) -> list[str]:
    """Lines under a table: each flagged arm, its flags and their figures (``flagged``: arm -> ``arm_flags``)."""
    lines = []
    for arm, flags in flagged.items():
        if flags:
            said = "; ".join(f"{flag} ({', '.join(details)})" for flag, details in flags.items())
            lines.append(f"health of {arm}: {said}")
    return lines
