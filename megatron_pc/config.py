"""Experiment configuration.

Each component owns one dataclass next to its code (``megatron_pc/<component>/config.py``);
this module assembles them into :class:`Config`, reads a named experiment (a YAML file that
overrides fields) and dotted command-line overrides (``allocation.pilot.n=16``), and
validates everything before any work starts. Defaults live only in the dataclasses, and they
are the tiny CPU configuration, so ``Config()`` is the embedded default run.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence, Union, get_args, get_origin, get_type_hints

import yaml

from megatron_pc.allocation.config import AllocationConfig
from megatron_pc.cluster.config import ClusterConfig
from megatron_pc.data.config import DataConfig
from megatron_pc.errors import ConfigError
from megatron_pc.metrics.config import LoggingConfig
from megatron_pc.models.config import ModelConfig
from megatron_pc.reward.config import RewardConfig
from megatron_pc.rollout.config import RolloutConfig
from megatron_pc.training.config import TrainingConfig

__all__ = ["Config", "ConfigError", "load_config", "from_dict", "to_dict", "apply_overrides"]


@dataclass
class Config:
    """One experiment: every component's settings."""

    name: str = "tiny_cpu"
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
        # Rounds are split evenly over the generation engines; check it can always be done.
        self.allocation.check_generation_ranks(self.rollout.engines, field_prefix="allocation")
        self.reward.check_max_tokens(self.rollout.max_tokens, field_prefix="reward")
        self.rollout.check_placement(self.cluster.placement, field_prefix="rollout")
        if self.training.pipelined and self.cluster.placement != "split":
            raise ConfigError("training.pipelined", "needs cluster.placement=split: colocated engines sleep while the policy trains, "
                              "so generation cannot overlap training")  # fmt: skip

    @property
    def resolved_run_dir(self) -> Path:
        """The run directory with ``{name}`` filled in."""
        return Path(self.run_dir.format(name=self.name))


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read a named experiment (YAML of overrides) plus dotted overrides into a validated Config.

    ``path`` may be None for the embedded default. Raises :class:`ConfigError` naming the
    dotted field for unknown keys, wrong types and broken rules.
    """
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError("config", f"file {path} does not exist")
        try:
            loaded = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
        except yaml.YAMLError as err:
            raise ConfigError("config", f"{path} is not valid YAML: {err}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError("config", f"{path} must hold a mapping of fields, got {type(loaded).__name__}")
        data = loaded or {}
    data = apply_overrides(data, overrides)
    return from_dict(Config, data)


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


_YAML_BOOL_WORDS = {True: ("on", "yes", "y", "true"), False: ("off", "no", "n", "false")}
"""Words YAML reads as booleans: a choice spelled so (``preset: off``) is the choice, not the boolean."""


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


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, checking keys and types; errors name the field."""
    if not isinstance(data, dict):
        raise ConfigError(prefix or cls.__name__, f"expected a mapping of fields, got {_describe(data)}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        shown = key if isinstance(key, str) and key.strip() and key == key.strip() else repr(key)  # '' or ' x' or 3: quoted
        dotted = f"{prefix}.{shown}" if prefix else shown
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(prefix + '.' + c if prefix else c for c in close)}?" if close else ""
            allowed = ", ".join(names)
            raise ConfigError(dotted, f"unknown field{hint} (fields here: {allowed})")
        kwargs[key] = _coerce(value, hints[key], dotted)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.within(prefix) from None


def to_dict(obj: Any) -> Any:
    """A plain, YAML/JSON-ready copy of a config dataclass."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def _coerce(value: Any, tp: Any, dotted: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, dotted)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise ConfigError(dotted, "must not be null")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, dotted)
            except ConfigError as err:
                errors.append(err.rule)
        raise ConfigError(dotted, " or ".join(errors))
    if origin is Literal:
        allowed = get_args(tp)
        if isinstance(value, bool):  # YAML reads an unquoted off / on / no / yes as a boolean
            spelled = [a for a in allowed if isinstance(a, str) and a.lower() in _YAML_BOOL_WORDS[value]]
            value = spelled[0] if len(spelled) == 1 else value
        if value not in allowed:
            raise ConfigError(dotted, f"must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
        return value
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(dotted, f"must be true or false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(dotted, f"must be an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, str):
            # YAML 1.1 reads 1e-5 (no dot) as a string; accept what Python reads as a number.
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(dotted, f"must be a number, got {_describe(value)}")
        if not math.isfinite(value):
            raise ConfigError(dotted, f"must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(dotted, f"must be a string, got {_describe(value)}")
        return value
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(dotted, f"must be a list, got {_describe(value)}")
        (item_tp,) = get_args(tp)[:1] or (Any,)
        return [_coerce(v, item_tp, f"{dotted}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(dotted, f"must be a mapping, got {_describe(value)}")
        args = get_args(tp)
        val_tp = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(v, val_tp, f"{dotted}.{k}") for k, v in value.items()}
    raise TypeError(f"config field {dotted} has a type the loader does not handle: {tp!r}")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if value is not None else "null"


def _deep_copy(data: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in data.items()}
