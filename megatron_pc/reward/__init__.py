"""Rewards: final-answer extraction, the built-in graders (math-verify, integers) and your own
compute_score (custom.py), run in a process pool with timeouts."""

from megatron_pc.reward.config import RewardConfig
from megatron_pc.reward.extract import extract_answer
from megatron_pc.reward.functions import REWARD_FUNCTIONS, Grade
from megatron_pc.reward.pool import RewardPool, RewardResult, overlong_penalty

__all__ = ["RewardConfig", "RewardPool", "RewardResult", "Grade", "REWARD_FUNCTIONS", "extract_answer", "overlong_penalty"]
