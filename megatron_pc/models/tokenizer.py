"""A character-level tokenizer for arithmetic prompts ("12+345=") and answers ("357").

Built with the ``tokenizers`` library and wrapped as a standard Hugging Face fast tokenizer,
so ``save_pretrained`` writes tokenizer.json + tokenizer_config.json that both
``transformers.AutoTokenizer`` and vLLM load from the model directory.

Ids are fixed: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3, then the characters in
:data:`CHARACTERS` order. Encoding adds ``<bos>`` in front (the warm-up trains on it), never
``<eos>``: a prompt is a prefix the model continues.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
# Digits and operators carry the task; space and a few letters leave room for prompts such
# as "what is 3+4=" without falling back to <unk> (letters are never trained, only mapped).
CHARACTERS: str = "0123456789+-*=() abcdefghijklmnopqrstuvwxyz?."


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The arithmetic character tokenizer, ready for ``save_pretrained``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # One piece per character; spaces are pieces too (isolated), not separators.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Fuse joins pieces without the blank a WordLevel decoder would put between them.
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        # Left padding keeps a batch of prompts aligned at their last token for generation.
        padding_side="left",
    )
    return tokenizer
