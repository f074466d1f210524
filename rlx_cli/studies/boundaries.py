"""The boundary arithmetic of a study judged at several looks: Lan-DeMets alpha spending.

A one-sided test of overall level γ looked at with information fractions t_1 < … < t_L (the seeds at each look over
the most seeds a study may use) spends γ(t) of its level by fraction t, γ(1) = γ (Lan & DeMets 1983):

- ``pocock`` (the default): γ(t) = γ · ln(1 + (e − 1) t), Pocock-type (gsDesign's ``sfLDPocock``): about a third of γ
  at a quarter of the seeds, nearly even thresholds over the looks;
- ``obf``: γ(t) = 2 − 2Φ(z_{1−γ/2} / √t), O'Brien-Fleming-type (``sfLDOF``): almost nothing at the first looks.

rlx's looks come after few seeds, so a look's t-test has few degrees of freedom: at a quarter of 20 seeds (df 4) the
O'Brien-Fleming threshold of a 4-arm family (one-sided 2e-7) needs t ≈ 60, a look that decides nothing, and the
arms go on to the second look; Pocock's (about 2e-3) is reachable. Measured in ``tests/test_sequential.py``: mean
seeds an arm 8.4 (Pocock) against 11.8 (O'Brien-Fleming) at Δ = 2δ, σ = δ; 6.0 against 10.0 for equivalence at
σ = δ/3; at Δ = δ, σ = δ, 14.4 against 16.5, deciding 87% against 94% of the arms by 20 seeds.

Boundary c_k is the z whose first crossing at look k, under the null, has the probability γ(t_k) − γ(t_{k−1}); the
z-statistics of the looks are those of a Brownian motion, corr(Z_i, Z_j) = √(t_i / t_j). ``nominal`` returns each
look's boundary as a one-sided p-value threshold (1 − Φ(c_k)), which a look's t-test is held to (the nominal-p form
of a group-sequential t-test). A study with one look at t = 1 is the fixed design: its threshold is γ itself.

The crossing probabilities are integrals of the density of the score process S_k = Z_k √t_k over the region where no
earlier look crossed, computed by Simpson's rule on a grid (Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000,
ch. 19): to 1e-7 with 401 points, against the published 4.333, 2.963, 2.359, 2.014 (γ 0.025, four equal looks).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize, special

POINTS = 401  # odd: Simpson's rule
SPAN = 8.0  # the grid reaches 8 standard deviations below 0: the mass left out is under 1e-15


SPENDING = {
    "pocock": lambda t, level: level * math.log(1 + (math.e - 1) * t),
    "obf": lambda t, level: float(2 - 2 * special.ndtr(special.ndtri(1 - level / 2) / math.sqrt(t))),
}


def spent(t: float, level: float, spending: str = "pocock") -> float:
    """γ(t): the share of a one-sided test's ``level`` spent by information fraction ``t`` (0 at t = 0)."""
    return 0.0 if t <= 0 else float(SPENDING[spending](t, level))


def simpson(count: int, width: float) -> np.ndarray:
    weights = np.ones(count)
    weights[1:-1:2], weights[2:-1:2] = 4, 2
    return weights * width / 3


def solve(mass: np.ndarray, grid: np.ndarray, t: float, before: float, increment: float) -> float:
    """The z boundary at fraction ``t`` whose first crossing has probability ``increment``: P(no crossing before,
    S_t >= c √t) as a function of c, from the probability ``mass`` [points] of S_before on ``grid``."""
    spread = math.sqrt(t - before)

    def crossing(c: float) -> float:
        return float(mass @ special.ndtr((grid - c * math.sqrt(t)) / spread)) - increment

    return optimize.brentq(crossing, -10.0, 40.0, xtol=1e-12)


@functools.lru_cache(maxsize=4096)
def nominal(level: float, fractions: tuple[float, ...], spending: str = "pocock") -> tuple[float, ...]:
    """One-sided nominal p thresholds, one per look: a look's test rejects when its one-sided p is below it.

    ``level``: the one-sided test's overall level γ (0 < γ < 1); ``fractions``: increasing, in (0, 1];
    ``spending``: one of ``SPENDING``."""
    if not 0 < level < 1:
        raise ValueError(f"level {level} is not valid (valid: above 0 and below 1)")
    if any(b <= a for a, b in zip(fractions, fractions[1:])) or not 0 < fractions[0] <= fractions[-1] <= 1:
        raise ValueError(f"information fractions {fractions} are not valid (valid: increasing, in (0, 1])")
    if fractions == (1.0,):  # the fixed design: spent(1, γ) = γ, exactly rather than through ndtri and back
        return (level,)
    thresholds, grid, mass, before = [], None, None, 0.0
    for t in fractions:
        increment = spent(t, level, spending) - spent(before, level, spending)
        bound = -float(special.ndtri(increment)) if grid is None else solve(mass, grid, t, before, increment)
        thresholds.append(float(special.ndtr(-bound)))
        inside = np.linspace(-SPAN * math.sqrt(t), bound * math.sqrt(t), POINTS)  # where S_t has not crossed yet
        if grid is None:
            density = np.exp(-(inside**2) / (2 * t)) / math.sqrt(2 * math.pi * t)
        else:
            step = t - before
            kernel = np.exp(-((inside[None, :] - grid[:, None]) ** 2) / (2 * step)) / math.sqrt(2 * math.pi * step)
            density = mass @ kernel
        grid, before = inside, t
        mass = density * simpson(POINTS, grid[1] - grid[0])
    return tuple(thresholds)
