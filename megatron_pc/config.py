"""Experiment configuration.

Each component owns one dataclass next to its code (``megatron_pc/<component>/config.py``);
this module assembles them into :class:`Config`, reads a named experiment (a YAML file that
overrides fields) and dotted command-line overrides (``allocation.pilot.n=16``), and
validates everything before any work starts. Defaults live only in the dataclasses, and they
are a real GPU run's: the paper's Qwen3-4B recipe on one GPU (configs/qwen3_4b.yaml is them plus
its layout, data and validation sets). The tiny CPU run writes its small values in
configs/tiny_cpu.yaml, which is what a command given no CONFIG runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from megatron_pc.allocation import strategy_class
from megatron_pc.allocation.config import AllocationConfig
from megatron_pc.cluster.config import ClusterConfig, Layout
from megatron_pc.data.config import DataConfig
from megatron_pc.errors import ConfigError
from megatron_pc.fields import from_dict, to_dict
from megatron_pc.metrics.config import LoggingConfig
from megatron_pc.models.config import ModelConfig
from megatron_pc.reward.config import RewardConfig
from megatron_pc.rollout.config import RolloutConfig
from megatron_pc.training.config import TrainingConfig

__all__ = ["Config", "ConfigError", "load_config", "from_dict", "to_dict", "apply_overrides", "config_path", "CONFIGS_DIR",
           "TINY_CONFIG", "DEFAULTS"]

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The checkout's named experiments (``megatron-pc train qwen3_14b`` reads configs/qwen3_14b.yaml)."""
TINY_CONFIG = CONFIGS_DIR / "tiny_cpu.yaml"
"""The tiny CPU run: what a command given no CONFIG runs."""
DEFAULTS = "defaults"
"""The config name of the bare dataclass defaults (a real GPU run's), with no file."""


@dataclass
class Config:
    """One experiment: every component's settings."""

    name: str = "run"
    """Experiment name; used in the default run directory and in logs."""
    seed: int = 1234
    """Seed for everything stochastic (data order, sampling, initialisation)."""
    run_dir: str = "runs/{name}"
    """Where checkpoints, metrics and traces go; ``{name}`` is replaced by ``name``."""
    allocation: AllocationConfig = field(default_factory=AllocationConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in "/\\ "):
            raise ConfigError("name", f"must be a non-empty name without '/', '\\' or spaces, got {self.name!r}")
        # The strategy checks what it needs of the allocation settings, and that its rounds
        # split evenly over the generation engines.
        strategy = strategy_class(self.allocation.strategy)
        strategy.check_config(self.allocation, field_prefix="allocation")
        strategy.check_generation_ranks(self.allocation, self.rollout.engines, field_prefix="allocation")
        self.reward.check_max_tokens(self.rollout.max_tokens, field_prefix="reward")
        self.rollout.check_placement(self.cluster.colocated, field_prefix="rollout")
        if self.rollout.weight_transport == "cuda_ipc" and self.model.pipeline_parallel != 1:
            raise ConfigError("rollout.weight_transport", "cuda_ipc needs model.pipeline_parallel 1: every policy rank hands the "
                              f"engine worker on its GPU the whole model, and a pipeline stage holds only its layers; got "
                              f"{self.model.pipeline_parallel}; use object_store")
        if self.model.layer_spec == "local" and self.training.sequence_parallel and self.model.tensor_parallel > 1:
            raise ConfigError("model.layer_spec", "local (Megatron's local spec) cannot run training.sequence_parallel: its "
                              "WrappedTorchNorm asserts `not config.sequence_parallel`; use sdpa (ours) or te (Transformer "
                              "Engine, docs/gpu_install.md), or set training.sequence_parallel=false")
        if self.training.pipelined and self.cluster.colocated:
            raise ConfigError("training.pipelined", "needs cluster.placement=split: colocated engines sleep while the policy trains, "
                              "so generation cannot overlap training")  # fmt: skip

    @property
    def resolved_run_dir(self) -> Path:
        """The run directory with ``{name}`` filled in."""
        return Path(self.run_dir.format(name=self.name))

    @property
    def policy_world(self) -> int:
        """The policy's ranks (and devices on a GPU run): TP x PP x DP."""
        return self.model.tensor_parallel * self.model.pipeline_parallel * self.cluster.data_parallel

    @property
    def layout(self) -> Layout:
        """The workers the run places (cluster/ takes this, not the whole Config)."""
        return Layout(self.policy_world, self.rollout.engines, self.rollout.tensor_parallel, self.training.kl_coef > 0)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read a named experiment (YAML of overrides) plus dotted overrides into a validated Config.

    ``path`` is a YAML file or the name of one in configs/ (``qwen3_14b``); None is the tiny CPU
    run (configs/tiny_cpu.yaml); ``DEFAULTS`` is the dataclass defaults alone. Raises
    :class:`ConfigError` naming the dotted field for unknown keys, wrong types and broken rules.
    """
    data: dict[str, Any] = {}
    if path is None:
        path = TINY_CONFIG
    if str(path) != DEFAULTS:
        path = Path(config_path(str(path)))
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml")))
            raise ConfigError("config", f"file {path} does not exist (a name resolves to configs/NAME.yaml: {known}; "
                              f"{DEFAULTS}: the dataclass defaults)")
        try:
            loaded = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
        except yaml.YAMLError as err:
            raise ConfigError("config", f"{path} is not valid YAML: {err}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError("config", f"{path} must hold a mapping of fields, got {type(loaded).__name__}")
        data = loaded or {}
    data = apply_overrides(data, overrides)
    return from_dict(Config, data)


def config_path(name: str) -> str:
    """A file path as given, else configs/<name>.yaml when that exists (``qwen3_14b``)."""
    named = CONFIGS_DIR / f"{name}.yaml"
    return str(named) if not Path(name).exists() and named.is_file() else name


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (the safe
    loader keeps the last silently, so a config would not say what it seems to)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (first at line {seen[key].start_mark.line + 1})", key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with ``a.b.c=value`` overrides applied (values parsed as YAML)."""
    out = _deep_copy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(item, "an override must look like section.field=value")
        parts = key.strip().split(".")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(".".join(parts[: i + 1]), f"is a value, not a section; cannot set {key}")
            node = child
        node[parts[-1]] = value
    return out


def _deep_copy(data: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in data.items()}
