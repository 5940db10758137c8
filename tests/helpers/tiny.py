"""Tiny random causal LMs with a real tokenizer, saved as ordinary model directories or GGUF files, for tests.

``save_tiny_model(dir)`` writes config.json, safetensors weights, a byte-level BPE tokenizer
(trained in-process on a small English corpus, so it encodes any text, any Unicode included,
and decodes it back exactly) and a ChatML chat template. ``save_tiny_gguf(file)`` writes such a
model (qwen2 family) as an unquantized GGUF, as llama.cpp's converter would. Nothing is
downloaded. Deterministic for a given seed. Each takes about a second at most.

The architectures are those of the engine's family table (`cake_cli.engine.families.FAMILIES`),
plus "gpt2" (unsupported, for refusal tests); `family_config` gives each family a tiny config
whose features (sliding windows, soft-capping, query_pre_attn_scalar, partial rotary) matter.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from cake_cli.engine.families import FAMILIES

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


GEMMA_CHAT_TEMPLATE = (  # Gemma's turn markup (no system role), for the gemma families' tiny tokenizers
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' "
    "+ message['content'] + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


def family_config(
    arch: str,
    *,
    layers: int = 4,
    heads: int = 8,
    kv_heads: int = 2,
    head_dim: int = 8,
    vocab: int = 512,
    max_positions: int = 8192,
    **overrides,
):
    """A transformers config of family ``arch`` (a model type of `FAMILIES`) with this shape.

    Family defaults that make each family's features matter on a tiny model: Mistral has no
    sliding window unless given (its config defaults to 4096); Gemma 2/3 get an 8-token sliding
    window on local layers (Gemma 2: every other layer, Gemma 3: two local layers then a global
    one), a query_pre_attn_scalar of 2·d (so the scale is not d ** -0.5) and, for Gemma 2, an
    attention soft-cap of 1 that bites on tiny logits; Phi-3 rotates half of each head
    (partial_rotary_factor 0.5). ``overrides`` replace any field.
    """
    if arch not in FAMILIES:
        raise ValueError(f"arch {arch!r} is not a supported family ({', '.join(FAMILIES)})")
    fields = dict(
        vocab_size=vocab,
        hidden_size=heads * head_dim,
        intermediate_size=2 * heads * head_dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "mistral":
        fields["sliding_window"] = None
    if arch in ("gemma2", "gemma3_text"):
        every = 2 if arch == "gemma2" else 3
        fields.update(
            sliding_window=8,
            query_pre_attn_scalar=2 * head_dim,
            layer_types=["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)],
        )
    if arch == "gemma2":
        fields["attn_logit_softcapping"] = 1.0
    if arch == "phi3":
        fields.update(partial_rotary_factor=0.5, original_max_position_embeddings=max_positions)
    fields.update(overrides)
    return transformers.AutoConfig.for_model(arch, **fields)


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
    **overrides,
) -> Path:
    """Save a tiny random causal LM + tokenizer into ``dir`` (created) and return it as a Path.

    Args:
        layers, heads, kv_heads, hidden: model shape (GQA when kv_heads < heads; head dim is
            hidden // heads).
        vocab: model vocabulary; None = the tokenizer's size (512). Larger values pad the
            embedding with ids the tokenizer never produces.
        arch: a model type of `FAMILIES` (see `family_config` for each family's tiny defaults),
            or "gpt2" (unsupported, for refusal tests). The Gemma families get Gemma's chat
            template.
        max_positions: max_position_embeddings (tokens).
        seed: torch seed for the random weights.
        overrides: config fields (e.g. ``sliding_window=64``).
    """
    if arch not in FAMILIES and arch != "gpt2":
        raise ValueError(f"arch {arch!r} is neither a supported family ({', '.join(FAMILIES)}) nor gpt2")
    d = Path(dir)
    d.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    if arch.startswith("gemma"):
        tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
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
        config = family_config(
            arch,
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=hidden // heads,
            vocab=vocab,
            max_positions=max_positions,
            **{**ids, **overrides},
        )
        cls = transformers.AutoModelForCausalLM.from_config
    torch.manual_seed(seed)
    model = cls(config).eval()
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


_GGUF_NAMES = {  # transformers' qwen2 parameter names -> llama.cpp's ({} = layer index)
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "blk.{}.attn_norm.weight",
    "post_attention_layernorm.weight": "blk.{}.ffn_norm.weight",
    "self_attn.q_proj.weight": "blk.{}.attn_q.weight",
    "self_attn.q_proj.bias": "blk.{}.attn_q.bias",
    "self_attn.k_proj.weight": "blk.{}.attn_k.weight",
    "self_attn.k_proj.bias": "blk.{}.attn_k.bias",
    "self_attn.v_proj.weight": "blk.{}.attn_v.weight",
    "self_attn.v_proj.bias": "blk.{}.attn_v.bias",
    "self_attn.o_proj.weight": "blk.{}.attn_output.weight",
    "mlp.gate_proj.weight": "blk.{}.ffn_gate.weight",
    "mlp.up_proj.weight": "blk.{}.ffn_up.weight",
    "mlp.down_proj.weight": "blk.{}.ffn_down.weight",
}


def _gguf_name(name: str) -> str:
    if name in _GGUF_NAMES:
        return _GGUF_NAMES[name]
    _, _, index, rest = name.split(".", 3)  # model.layers.<i>.<rest>
    return _GGUF_NAMES[rest].format(index)


def save_tiny_gguf(
    file, *, layers: int = 2, seed: int = 0, name: str = "tiny qwen2", kind: str = "F32", tied: bool = False
) -> tuple[Path, Path]:
    """Write a tiny random qwen2 model (8 query / 2 KV heads, hidden 64) as a GGUF ``file``.

    The same model is first saved as a directory next to it (``<file>.model``), the oracle: the
    GGUF converted back must give its logits (exactly for ``kind`` F32). Tokenizer: the tiny
    byte-level BPE as a GGUF "gpt2" tokenizer with the ChatML template. ``seed`` changes the
    weights, hence the file's sha256. ``kind``: the GGML type of every matrix (``F32``, or a type
    gguf-py quantizes: ``Q8_0``, ``Q5_0``, ``Q4_0``, ``Q4_1``, ``F16``); vectors stay F32.
    ``tied``: no ``output.weight`` (the head is the embedding, as in SmolLM2's GGUF).

    Returns:
        (the GGUF file, the model directory).
    """
    file = Path(file)
    model_dir = save_tiny_model(file.with_suffix(".model"), layers=layers, arch="qwen2", seed=seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    config = model.config
    writer = gguf.GGUFWriter(str(file), "qwen2")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL_TOKENS else 1 for t in tokens])  # 3 = control
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_chat_template(CHAT_TEMPLATE)
    qtype = gguf.GGMLQuantizationType[kind]
    for param, tensor in model.state_dict().items():
        if tied and param == "lm_head.weight":
            continue
        values = tensor.float().numpy()
        if values.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(_gguf_name(param), gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(_gguf_name(param), values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return file, model_dir
