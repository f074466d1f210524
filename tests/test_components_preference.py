"""DPO and IPO on hand-computed per-pair log-probs, sequence log-probs (sum vs mean), online DPO's pair selection."""

import math

import pytest
import torch

from components import preference, registry


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_sigmoid_loss_rewards_margins_accuracy_by_hand():
    # β 0.5; log-ratios chosen [0.5, 0], rejected [-0.5, 0.5] -> Δ = [1, -0.5]
    chosen, rejected = torch.tensor([-1.0, -2.0], requires_grad=True), torch.tensor([-3.0, -1.0])
    ref_chosen, ref_rejected = torch.tensor([-1.5, -2.0]), torch.tensor([-2.5, -1.5])
    loss, m = preference.dpo(chosen, rejected, ref_chosen, ref_rejected, beta=0.5)
    # mean of −log σ(0.5·1) = 0.474077 and −log σ(0.5·(−0.5)) = 0.825939
    assert loss.item() == pytest.approx((-math.log(sigmoid(0.5)) - math.log(sigmoid(-0.25))) / 2)
    assert loss.item() == pytest.approx(0.650008, abs=1e-6)
    # rewards β·ratio: chosen [0.25, 0] -> 0.125; rejected [−0.25, 0.25] -> 0; margins [0.5, −0.25] -> 0.125
    assert m["rewards/chosen"].item() == pytest.approx(0.125)
    assert m["rewards/rejected"].item() == pytest.approx(0.0)
    assert m["rewards/margins"].item() == pytest.approx(0.125)
    assert m["rewards/accuracy"].item() == 0.5  # 0.25 > −0.25 yes, 0 > 0.25 no
    # ∂L/∂ℓ(y_w) = −β·σ(−βΔ)/P
    (grad,) = torch.autograd.grad(loss, chosen)
    assert grad.tolist() == pytest.approx([-0.5 * sigmoid(-0.5) / 2, -0.5 * sigmoid(0.25) / 2])


# two pairs as token log-probs: rows 0, 1 chosen, rows 2, 3 rejected; padding holds numbers that must not count
LOGP = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, 9.0], [-2.0, -2.0, 7.0], [-1.0, -1.0, -1.0]])
REF = torch.tensor([[-1.0, -1.0, -1.0], [-4.0, -4.0, 5.0], [-3.0, -3.0, 5.0], [-2.0, -2.0, -2.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_sequence_logp_sums_for_dpo_and_averages_for_ipo():
    assert preference.sequence_logp(LOGP, MASK).tolist() == [-6.0, -9.0, -4.0, -3.0]
    assert preference.sequence_logp(LOGP, MASK, kind="ipo").tolist() == [-2.0, -4.5, -2.0, -1.0]
    assert preference.sequence_logp(LOGP[:1], torch.zeros(1, 3), kind="ipo").tolist() == [0.0]  # no token: 0


def ipo_loss(kind_of_logp: str) -> tuple[float, dict]:
    x = preference.sequence_logp(LOGP, MASK, kind=kind_of_logp)
    ref = preference.sequence_logp(REF, MASK, kind=kind_of_logp)
    return preference.dpo(x[:2], x[2:], ref[:2], ref[2:], beta=0.5, kind="ipo")


def test_ipo_on_length_averaged_log_ratios_by_hand():
    # means: policy [−2, −4.5 | −2, −1], reference [−1, −4 | −3, −2]: ratios chosen [−1, −0.5], rejected [1, 1]
    # Δ = [−2, −1.5]; 1/(2β) = 1 -> (Δ − 1)² = [9, 6.25] -> 7.625
    loss, m = ipo_loss("ipo")
    assert loss.item() == pytest.approx(7.625)
    assert m["rewards/chosen"].item() == pytest.approx(0.5 * (-1 - 0.5) / 2)
    assert m["rewards/rejected"].item() == pytest.approx(0.5)
    assert m["rewards/margins"].item() == pytest.approx(-0.875)
    assert m["rewards/accuracy"].item() == 0.0
    # the same loss on summed log-probs (what the caller must not pass): sums [−6, −9 | −4, −3] vs [−3, −8 | −6, −6]
    # Δ = [−3 − 2, −1 − 3] = [−5, −4] -> (Δ − 1)² = [36, 25] -> 30.5
    summed, _ = ipo_loss("sigmoid")
    assert summed.item() == pytest.approx(30.5)


def test_dpo_kind_and_beta_are_checked_by_the_registry():
    with pytest.raises(registry.RegistryError, match="preference.kind='hinge' is not valid .*sigmoid, ipo"):
        registry.validate("preference", {"name": "dpo", "kind": "hinge"})
    with pytest.raises(registry.RegistryError, match="preference.beta=0"):
        registry.validate("preference", {"name": "dpo", "beta": 0.0})


def test_best_against_worst_of_each_group_ties_to_the_first_all_equal_skipped():
    scores = torch.tensor([0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 0.2, 0.9, 0.9])
    groups = torch.arange(4).repeat_interleave(3)
    chosen, rejected, tied = preference.best_worst(scores, groups)
    # group 0: best rows 1, 2 -> 1, worst 0; group 1: all 0.5, skipped; group 2: 6 v 7 (7, 8 tie); group 3: 10 v 9
    assert chosen.tolist() == [1, 6, 10] and rejected.tolist() == [0, 7, 9] and tied == 1


def test_groups_need_not_be_contiguous_and_all_equal_groups_give_no_pair():
    scores = torch.tensor([0.3, 1.0, 0.7, 0.0])
    chosen, rejected, tied = preference.best_worst(scores, torch.tensor([5, 2, 5, 2]))
    assert chosen.tolist() == [1, 2] and rejected.tolist() == [3, 0] and tied == 0  # group 2 first, then group 5
    chosen, rejected, tied = preference.best_worst(torch.ones(6), torch.arange(3).repeat_interleave(2))
    assert chosen.numel() == rejected.numel() == 0 and chosen.dtype == torch.long and tied == 3
