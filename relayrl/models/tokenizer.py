"""A byte-level tokenizer in Hugging Face format for the built-in tiny models.

It is a byte-level BPE with no merges: one token per byte, so the built-in tasks (digits,
arithmetic, short words) tokenize one symbol per token and any UTF-8 text round-trips.
Byte-level BPE with Qwen-style chat markers is the format Qwen2 checkpoints use, so
``AutoTokenizer`` rebuilds the very same tokenizer whether it picks ``Qwen2Tokenizer`` (for a
qwen2 config) or the generic backend (for llama).
"""

from __future__ import annotations

from pathlib import Path

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# Qwen2's ChatML layout; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_vocab() -> dict[str, int]:
    """Special tokens first, then the 256 byte symbols of the ByteLevel alphabet."""
    from tokenizers import pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda s: ord(s)):
        vocab[symbol] = len(vocab)
    return vocab


def build_byte_tokenizer():
    """A fast tokenizer whose EOS is ``<|im_end|>`` (the end of an assistant turn)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(vocab=byte_vocab(), merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def save_byte_tokenizer(directory: Path) -> None:
    build_byte_tokenizer().save_pretrained(str(directory))
