"""The tiny CPU run's component settings (configs/tiny_cpu.yaml) for tests that build one
component alone: the dataclass defaults are a real GPU run's (4096-token responses, CUDA graphs),
which a tiny model on CPU cannot take."""

from __future__ import annotations

import dataclasses
from typing import Any

from megatron_pc.config import load_config
from megatron_pc.rollout.config import RolloutConfig
from megatron_pc.training.config import TrainingConfig


def tiny_rollout(**changes: Any) -> RolloutConfig:
    """The tiny run's rollout settings with ``changes``."""
    return dataclasses.replace(load_config(None).rollout, **changes)


def tiny_training(**changes: Any) -> TrainingConfig:
    """The tiny run's training settings with ``changes``."""
    return dataclasses.replace(load_config(None).training, **changes)
