"""Tiny models and sequences made on the spot (no downloads), for the integration and GPU tests."""

from __future__ import annotations

from pathlib import Path

import torch

from megatron_pc.training.batching import Sequence

VOCAB = 100  # not a multiple of 128: the padded vocab rows are exercised


def make_hf_model(root: Path, model_type: str, *, tie: bool = False, layers: int = 2, seed: int = 0,
                  dtype: torch.dtype = torch.float32, initializer_range: float | None = None) -> Path:
    """A tiny random HF model (head_dim 32, GQA 4/2) saved in ``dtype`` safetensors under ``root``.

    ``initializer_range`` (transformers' default when None) spreads the log-probs: the GPU tests
    use 0.05 so that matching within a bf16 tolerance says something."""
    import transformers

    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "qwen3": transformers.Qwen3Config}[model_type]
    extra = {} if initializer_range is None else {"initializer_range": initializer_range}
    config = config_cls(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                        rope_theta=5000.0, tie_word_embeddings=tie, max_position_embeddings=256, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():
        # Norm weights start at 1 and biases at 0: randomise them so a mis-mapped one shows.
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    path = root / f"{model_type}{'-tied' if tie else ''}"
    model.to(dtype).save_pretrained(path, safe_serialization=True)
    return path


def random_sequences(n: int = 6, seed: int = 0, *, prompt: tuple[int, int] = (3, 8),
                     response: tuple[int, int] = (2, 9)) -> list[Sequence]:
    """Random prompt + response sequences, lengths drawn in [low, high), advantages of both signs."""
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for i in range(n):
        prompt_len = int(torch.randint(*prompt, (1,), generator=gen))
        response_len = int(torch.randint(*response, (1,), generator=gen))
        tokens = torch.randint(0, VOCAB, (prompt_len + response_len,), generator=gen).tolist()
        seqs.append(Sequence(tokens=tokens, prompt_len=prompt_len, advantage=1.0 if i % 2 == 0 else -1.0))
    return seqs


def bits(t: torch.Tensor) -> bytes:
    """The tensor's raw bytes: equal bits, not merely equal values (-0.0 and NaN included)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def make_warm_tiny_model(root: Path) -> Path:
    """The tiny Qwen2 after a short warm-up (a few seconds), as ``root/tiny-qwen2-arith``.

    The warm-up is there so logits are peaked rather than the near-uniform ones of a fresh
    model: greedy comparisons between two implementations then do not hinge on near-ties.
    """
    from megatron_pc.models.tiny import make_tiny_model

    return make_tiny_model(root / "tiny-qwen2-arith", seed=0, warmup_steps=40, batch_size=48, eval_prompts=8,
                           eval_samples=2)  # fmt: skip
