"""Hugging Face <-> Megatron-Core checkpoint conversion (Llama, Qwen2, Qwen3).

The name maps live in ``megatron_pc.models.name_maps`` (one source of truth for the loader,
the converters and the weight sync to vLLM), and the HF-weights check with its lazy safetensors
reader in ``megatron_pc.models.hf_check`` (the product checks a model with it too); this package
adds streamed safetensors writing, Megatron distributed checkpoints, and the command lines
``python -m conversion.hf_to_megatron`` / ``conversion.megatron_to_hf``.
"""
