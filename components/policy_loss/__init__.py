"""Policy-gradient surrogate losses over per-token log-probabilities: one group, two modules.

``clipped``: PPO's clip (with clip-higher and dual clip), Clip-Cov, KL-Cov and ``none``. ``off_policy``: the losses
the field moved to for updates far from the sampling policy: GSPO (a sequence-level ratio), CISPO (a clipped,
stop-gradient weight on the log-prob), SAPO (a soft gate instead of a clip) and GMPO (``geo_mean``: a geometric
mean of the token ratios). Each loss returns ``(loss, metrics)``: a 0-d tensor to minimise and a dict of detached
0-d tensors, and takes ``weights`` ``[B, T]``, the rollout correction's (``components/rollout_correction.py``), which
multiply its per-token term.
"""

from components.policy_loss.clipped import centred_covariance, clip_cov, kl_cov, none, ppo_clip, random_subset
from components.policy_loss.off_policy import cispo, geo_mean, gspo, sapo

__all__ = [
    "centred_covariance",
    "cispo",
    "clip_cov",
    "geo_mean",
    "gspo",
    "kl_cov",
    "none",
    "ppo_clip",
    "random_subset",
    "sapo",
]
