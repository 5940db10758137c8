"""Tiny random causal LMs with a real tokenizer, saved as ordinary model directories, for tests.

``save_tiny_model(dir)`` writes config.json, safetensors weights, a byte-level BPE tokenizer
(trained in-process on a small English corpus, so it encodes any text, any Unicode included,
and decodes it back exactly) and a ChatML chat template. Nothing is downloaded. Deterministic
for a given seed. Takes well under a second.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Summarize the following document in three sentences.",
    "What is the capital of France? The capital of France is Paris.",
    "A key-value cache stores the keys and values of every previous token.",
    "Attention layers differ: some look everywhere, others only at nearby tokens.",
    "The report shows the budget, the memory saved and the time taken for each layer.",
    "Question: who wrote the letter? Answer: the secretary wrote it on Monday morning.",
    "Numbers like 1, 2, 3, 42, 1024 and 3.14 appear in long documents too.",
    "You are a helpful assistant. Answer the question using the document below.",
]


def build_tiny_tokenizer(vocab_size: int = 512):
    """A PreTrainedTokenizerFast: byte-level BPE with ``vocab_size`` tokens (>= 259), ChatML
    template, ``<|im_end|>`` as eos, ``<|endoftext|>`` as pad/unk, ``<|im_start|>`` as bos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def save_tiny_model(
    dir,
    *,
    layers: int = 4,
    heads: int = 8,
    kv_heads: int = 2,
    hidden: int = 64,
    vocab: int | None = None,
    arch: str = "llama",
    max_positions: int = 8192,
    seed: int = 0,
) -> Path:
    """Save a tiny random causal LM + tokenizer into ``dir`` (created) and return it as a Path.

    Args:
        layers, heads, kv_heads, hidden: model shape (GQA when kv_heads < heads; head dim is
            hidden // heads).
        vocab: model vocabulary; None = the tokenizer's size (512). Larger values pad the
            embedding with ids the tokenizer never produces.
        arch: "llama", "mistral" or "qwen2" (the supported families), or "gpt2" (unsupported,
            for refusal tests).
        max_positions: max_position_embeddings (tokens).
        seed: torch seed for the random weights.
    """
    import torch
    import transformers

    d = Path(dir)
    d.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    vocab = vocab or len(tokenizer)
    if vocab < len(tokenizer):
        raise ValueError(f"vocab {vocab} is smaller than the tokenizer's {len(tokenizer)}")
    ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    if arch == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max_positions, **ids
        )
        cls = transformers.GPT2LMHeadModel
    else:
        config_cls, cls = {
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        }[arch]
        config = config_cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=max_positions,
            tie_word_embeddings=False,
            **ids,
        )
    torch.manual_seed(seed)
    model = cls(config).eval()
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d
