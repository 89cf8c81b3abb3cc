"""Pure RL math: group advantages and policy losses (torch only, no process groups)."""

from megatron_pc.algo.advantages import group_advantages
from megatron_pc.algo.losses import aggregate, kl_penalty, loss_denominator, policy_loss

__all__ = ["group_advantages", "policy_loss", "kl_penalty", "aggregate", "loss_denominator"]
