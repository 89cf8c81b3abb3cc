"""megatron_pc."""
