"""Megatron-Core GPT models built from Hugging Face configs (Llama, Qwen2, Qwen3) and their
HF weights. ``name_maps`` is the one source of truth for HF <-> Megatron names."""
