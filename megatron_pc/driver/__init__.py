"""The driver: the training loop and what it owns (data preparation, the policy update's data path,
evaluation, run checkpoints). It runs in one process and talks to the workers of megatron_pc.cluster."""
