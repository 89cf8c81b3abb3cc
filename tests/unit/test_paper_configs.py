"""The paper's reference runs in configs/: every value pinned to the released run scripts,
strategies, layouts, sbatch files.

The reference values come from the public recipe databricks/pilot-commit (a verl/FSDP recipe):
train_scripts/pc_qwen2.5-1.5b_p32c96.sh and train_scripts/pc_qwen3-4b_p16c48.sh (the grpo_ /
dapo_ scripts beside them for the baselines), recipe/pc/config/pc_trainer.yaml for what the
scripts leave to the recipe, and verl's defaults for what neither sets. No script was released
for 8B and 14B: those configs take the 4B values. Where we differ on purpose the config's
comment says so; the values below are then ours, with the reason beside them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from megatron_pc.algo.advantages import group_advantages
from megatron_pc.cli import main as cli_main
from megatron_pc.models.shapes import load_model_shape
from megatron_pc.config import Config, load_config, to_dict
from megatron_pc.reward.pool import overlong_penalty

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"

# In our field names: what both released PC scripts set (or leave to pc_trainer.yaml / verl).
SHARED: dict[str, Any] = {
    "allocation.strategy": "pilot_commit",
    "allocation.train_batch": 128,  # train_prompt_bsz
    "allocation.pilot.batch": 384,  # gen_prompt_bsz = train_prompt_bsz * 3
    "allocation.pilot.n_effective": None,  # exploration.n_effective null: every pilot is kept
    "allocation.pilot.keep": "max_variance",  # buffer_response_sampling_method
    "allocation.dapo_batch": 384,  # the dapo_ scripts' gen_prompt_bsz (GRPO draws train_batch)
    "allocation.p_lower": 0.125,  # diversity_threshold_lower
    "allocation.p_upper": 0.75,  # 1 - diversity_threshold_upper (0.25)
    "allocation.p_evict": 1.0,  # exclude_threshold_upper
    "allocation.buffer.max_age": 4,  # buffer_max_off_steps
    "allocation.buffer.age_rule": "reference",  # its drop rule: committed up to max_age + 1 later
    "allocation.buffer.capacity": None,  # buffer_size 100000, never reached (test below)
    "allocation.max_rounds": 10,  # max_num_gen_batches
    "allocation.on_round_limit": "error",  # the reference raises past the round limit
    "training.lr": 1e-6,  # optim.lr
    "training.warmup_steps": 10,  # optim.lr_warmup_steps (then constant: verl's warmup_style)
    "training.weight_decay": 0.1,  # optim.weight_decay
    "training.adam_beta1": 0.9,  # verl's AdamW betas (0.9, 0.999)
    "training.adam_beta2": 0.999,
    "training.grad_clip": 1.0,  # actor.grad_clip
    "training.mini_batch": 32,  # train_prompt_mini_bsz ...
    "training.mini_batch_unit": "call_rollouts",  # ... that verl multiplies by rollout.n
    "training.clip_low": 0.2,  # clip_ratio_low
    "training.clip_high": 0.28,  # clip_ratio_high
    "training.dual_clip": 10.0,  # clip_ratio_c
    "training.loss_agg": "token-mean",  # loss_agg_mode
    "training.kl_coef": 0.0,  # use_kl_loss False, use_kl_in_reward False
    "training.entropy_coef": 0.0,  # entropy_coeff
    "training.std_normalize": True,  # verl's norm_adv_by_std_in_grpo
    "training.tis_cap": None,  # no importance correction of the off-policy pilots
    "training.validate_every": 5,  # test_freq (and val_before_train: we validate at the start)
    "training.save_every": 20,  # save_freq
    "rollout.temperature": 1.0,
    "rollout.top_p": 1.0,
    "rollout.top_k": -1,
    "rollout.gpu_memory_utilization": 0.6,  # GPU_MEMORY_UTILIZATION
    "rollout.max_num_seqs": 1024,
    "data.max_prompt_tokens": 2048,  # max_prompt_length (truncation 'left', as ours)
    "data.chat_template": True,  # verl applies the tokenizer's chat template to the prompts
    "reward.function": "math_verify",  # theirs: verifier tinker_sympy (a sympy grader); not ours
}

# What differs between the two scripts, in our field names.
PC_1_5B: dict[str, Any] = {  # train_scripts/pc_qwen2.5-1.5b_p32c96.sh
    "model": "Qwen2.5-Math-1.5B",  # MODEL_PATH friendshipkim/Qwen2.5-Math-1.5B (a re-upload)
    "data.source": "data/deepmath-103k.jsonl",  # deepmath_103k_filtered/train.parquet
    "allocation.n": 128,  # pilot + commit
    "allocation.pilot.n": 32,  # exploration_n
    "commit_n": 96,  # n_resp_per_prompt
    "allocation.buffer.sampling": "max_variance",  # buffer_sampling_method
    "training.steps": 1000,  # total_training_steps
    "rollout.max_tokens": 8192,  # max_response_length
    "rollout.tensor_parallel": 1,  # ROLLOUT_TP
    "reward.overlong_buffer": 4096,  # enable_overlong_buffer True, overlong_buffer_len
    # penalty_factor 1.0 on +1 / -1 rewards = 0.5 on our 1 / 0 (test below)
    "reward.overlong_penalty": 0.5,
}
PC_4B: dict[str, Any] = {  # train_scripts/pc_qwen3-4b_p16c48.sh
    "model": "Qwen3-4B-Base",  # MODEL_PATH Qwen/Qwen3-4B-Base
    "data.source": "data/polaris-53k.jsonl",  # polaris_53k/train.parquet
    "allocation.n": 64,
    "allocation.pilot.n": 16,  # exploration_n
    "commit_n": 48,  # n_resp_per_prompt
    "allocation.buffer.sampling": "random",  # buffer_sampling_method
    "training.steps": 500,  # total_training_steps
    "rollout.max_tokens": 4096,  # max_response_length
    "rollout.tensor_parallel": 1,  # ROLLOUT_TP
    "reward.overlong_buffer": 0,  # enable_overlong_buffer False
}

# Every config: the reference values, plus what is its own (model, and for 8B / 14B the engine TP).
REFERENCE: dict[str, dict[str, Any]] = {
    "qwen2.5_math_1.5b": {**SHARED, **PC_1_5B},
    "qwen3_4b": {**SHARED, **PC_4B},
    "qwen3_8b": {**SHARED, **PC_4B, "model": "Qwen3-8B"},
    "qwen3_14b": {**SHARED, **PC_4B, "model": "Qwen3-14B", "rollout.tensor_parallel": 2},
}

# The script's 7 validation files (data.val_files), 1 sample per row at top_p 0.7 and the rollout
# temperature; the reference's data scripts repeat AIME and AMC problems 32 times (n_trials 32).
VALIDATION = [
    ("aime_2024", "data/aime24.jsonl", 32),
    ("aime_2025", "data/aime25.jsonl", 32),
    ("amc_2023", "data/amc23.jsonl", 32),
    ("math_500", "data/math500.jsonl", 1),
    ("deepmath", "data/deepmath-103k-test.jsonl", 1),
    ("minerva_math", "data/minerva_math.jsonl", 1),
    ("olympiad_bench", "data/olympiadbench.jsonl", 1),
]


@dataclass(frozen=True)
class Cluster:
    """The cluster shape we give one run (the reference's NNODES is in the config's comment)."""

    sbatch: str
    # node count -> overrides that fit that many nodes (the first is the config's own layout)
    layouts: dict[int, tuple[str, ...]]


CLUSTERS = {
    # The reference runs 1.5B on 2 nodes and 4B on 4 (NNODES): our second layouts.
    "qwen2.5_math_1.5b": Cluster("pc_1.5b", {1: (), 2: ("cluster.data_parallel=16", "rollout.engines=16")}),
    "qwen3_4b": Cluster("pc_4b", {2: (), 4: ("cluster.data_parallel=32", "rollout.engines=32")}),
    "qwen3_8b": Cluster("pc_8b", {4: (), 2: ("cluster.data_parallel=8", "rollout.engines=16")}),
    "qwen3_14b": Cluster("pc_14b", {8: ()}),
}
LAYOUTS = [(name, nodes, overrides) for name, c in CLUSTERS.items() for nodes, overrides in c.layouts.items()]
FIELDS = [(name, key) for name, ref in REFERENCE.items() for key in ref]

def _load(name: str, *overrides: str) -> Config:
    return load_config(CONFIGS / f"{name}.yaml", overrides)


def _value(cfg: Config, key: str) -> Any:
    if key == "model":
        return Path(cfg.model.path).name
    if key == "commit_n":
        return cfg.allocation.commit_rollouts
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_configs_dir_holds_exactly_the_four_paper_runs_besides_tiny_cpu() -> None:
    assert {p.stem for p in CONFIGS.glob("qwen*.yaml")} == set(REFERENCE) == set(CLUSTERS)


@pytest.mark.parametrize(("name", "key"), FIELDS)
def test_paper_config_field_equals_the_reference(name: str, key: str) -> None:
    assert _value(_load(name), key) == REFERENCE[name][key]


@pytest.mark.parametrize("name", REFERENCE)
def test_paper_config_groups_are_pilots_plus_commits_as_in_the_reference(name: str) -> None:
    a = _load(name).allocation
    assert a.pilot_kept == a.pilot.n and a.pilot_kept + a.commit_rollouts == a.n
    # The reference's age rule lets a pilot wait one step longer than max_age.
    assert a.max_commit_age == 5


@pytest.mark.parametrize("name", REFERENCE)
def test_paper_config_takes_the_references_optimizer_updates_per_step(name: str) -> None:
    cfg = _load(name)
    a, t = cfg.allocation, cfg.training
    rollouts = a.train_batch * a.n
    # verl: a mini-batch is 32 x the call's rollouts per prompt; 6 updates per PC step (the last
    # a third), 4 per GRPO / DAPO step.
    assert math.ceil(rollouts / (t.mini_batch * a.commit_rollouts)) == 6
    assert rollouts / (t.mini_batch * a.n) == 4


@pytest.mark.parametrize("name", REFERENCE)
def test_paper_config_validates_on_the_references_seven_sets(name: str) -> None:
    cfg = _load(name)
    sets = cfg.data.validation
    assert isinstance(sets, list)
    assert [(s.name, s.path, s.n) for s in sets] == VALIDATION
    assert all(s.top_p == 0.7 for s in sets)  # val_top_p
    # val_kwargs.temperature is the rollout temperature in the scripts: left unset, so it follows.
    assert all(s.temperature is None for s in sets) and cfg.rollout.temperature == 1.0


@pytest.mark.parametrize("name", REFERENCE)
def test_paper_config_lengths_are_the_references_prompt_plus_response(name: str) -> None:
    cfg = _load(name)
    r, longest = cfg.rollout, cfg.data.max_prompt_tokens + cfg.rollout.max_tokens
    assert r.max_model_len == longest  # one engine holds a whole sequence
    # Training packs whole sequences: one micro-batch holds the longest, as the reference's
    # per-GPU token budget (ppo_max_token_len_per_gpu = prompt + response).
    assert cfg.training.micro_batch_tokens == longest
    assert r.max_num_batched_tokens == longest  # the scripts' vLLM max_num_batched_tokens
    assert cfg.reward.overlong_buffer < r.max_tokens


def test_overlong_penalty_half_on_our_reward_scale_gives_the_references_advantages() -> None:
    # The 1.5B run: reward +1 / -1 plus the overlong term at penalty_factor 1.0 there, 1 / 0 plus
    # the term at 0.5 here. GRPO normalises rewards per group, so the advantages must agree.
    cfg = _load("qwen2.5_math_1.5b")
    max_tokens, buffer = cfg.rollout.max_tokens, cfg.reward.overlong_buffer
    correct = [True, True, False, False, True, False, True, False]
    lengths = [100, 7000, 8192, 3000, 8192, 5000, 4096, 6500]
    shaped = [overlong_penalty(k, max_tokens, buffer, 1.0) for k in lengths]
    assert sum(p < 0 for p in shaped) >= 3  # the shaping is exercised, not bypassed
    theirs = torch.tensor([(1.0 if c else -1.0) + p for c, p in zip(correct, shaped)])
    factor = cfg.reward.overlong_penalty
    ours = torch.tensor([float(c) + overlong_penalty(k, max_tokens, buffer, factor) for c, k in zip(correct, lengths)])
    ids = torch.zeros(len(correct), dtype=torch.int64)
    torch.testing.assert_close(group_advantages(ours, ids), group_advantages(theirs, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", REFERENCE)
def test_reference_buffer_size_could_never_bind_so_no_capacity_is_set(name: str) -> None:
    a = _load(name).allocation
    # At most every pilot of every round of a step is added; an entry lives max_commit_age + 1 steps.
    most_waiting = a.pilot.batch * a.max_rounds * (a.max_commit_age + 1)
    assert most_waiting < 100_000  # pc_trainer.yaml's buffer_size


@pytest.mark.parametrize("strategy", ["pilot_commit", "grpo", "dapo"])
@pytest.mark.parametrize("name", REFERENCE)
def test_paper_config_validates_with_each_strategy_chosen_by_one_override(name: str, strategy: str) -> None:
    cfg = _load(name, f"allocation.strategy={strategy}")
    assert cfg.allocation.strategy == strategy
    assert cfg.allocation.n == REFERENCE[name]["allocation.n"]  # same group size for the fair comparison


def _leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        out.update(_leaves(value, dotted + ".") if isinstance(value, dict) else {dotted: value})
    return out


@pytest.mark.parametrize("name", REFERENCE)
def test_paper_config_restates_no_default_but_the_recipe_the_defaults_come_from(name: str) -> None:
    # The defaults are the 4B recipe on one GPU; each paper config writes that recipe whole, so it
    # reads alone, and nothing else that equals a default.
    written = _leaves(yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()))
    recipe = _leaves(yaml.safe_load((CONFIGS / "qwen3_4b.yaml").read_text()))
    defaults = _leaves(to_dict(Config()))
    same = [key for key, value in written.items() if defaults[key] == value and key not in recipe]
    assert same == [], f"{name}.yaml repeats defaults: {same}"


@pytest.mark.parametrize("name", REFERENCE)
def test_planner_knows_each_paper_model_before_it_is_downloaded(name: str) -> None:
    cfg = _load(name)
    assert load_model_shape(cfg.model.path).layers > 0


@pytest.mark.parametrize(("name", "nodes", "overrides"), LAYOUTS)
def test_planner_accepts_paper_config_at_its_intended_node_count(
    name: str, nodes: int, overrides: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["plan", str(CONFIGS / f"{name}.yaml"), "--no-data-check", "--nodes", str(nodes), "--gpus-per-node", "8", *overrides]) == 0
    out, err = capsys.readouterr()
    assert f"cluster  {nodes} nodes x 8 GPUs" in out and out.rstrip().endswith("fits"), err
    # The engine count of this layout must split every strategy's rounds evenly (load validates it).
    for strategy in ("grpo", "dapo"):
        assert _load(name, *overrides, f"allocation.strategy={strategy}").allocation.strategy == strategy


@pytest.mark.parametrize("name", CLUSTERS)
def test_sbatch_file_runs_its_config_on_the_node_count_the_config_plans_for(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = CLUSTERS[name]
    text = (REPO / "slurm" / f"{cluster.sbatch}.sbatch").read_text()
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert nodes == next(iter(cluster.layouts))
    assert re.search(r"^#SBATCH --gpus-per-node=8$", text, re.M)
    assert re.search(rf'^exec bash "\$repo/slurm/bootstrap.sh" "\$repo/configs/{re.escape(name)}.yaml"$', text, re.M)
    assert cli_main(["plan", str(CONFIGS / f"{name}.yaml"), "--no-data-check", "--nodes", str(nodes)]) == 0
    capsys.readouterr()


def test_planner_refuses_the_14b_config_on_half_its_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["plan", str(CONFIGS / "qwen3_14b.yaml"), "--no-data-check", "--nodes", "4"]) == 2
    assert "colocated: policy TP x PP x DP = 2 x 1 x 32 = 64 GPUs, but the cluster has 4 x 8 = 32" in capsys.readouterr().err
