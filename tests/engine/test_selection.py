"""`--prefill select` (GemFilter's early-layer selection): the scores equal the layer's full attention
computed by transformers' eager path, the kept tokens are the top-k by a plain sort, and keeping
every token gives exactly the normal prefill."""

from __future__ import annotations

import pytest
import torch

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.families import UnsupportedModelError
from cake_cli.engine.generate import generate
from cake_cli.engine.replay import prefix_cache
from cake_cli.engine.selection import default_layer, select_tokens, selection_scores, top_tokens
from tests.helpers.models import ids_of, tiny_family, tiny_llama


def reference_scores(model, ids: torch.Tensor, layer: int, queries: int) -> torch.Tensor:
    """[n] float64: the eager model's own attention matrix of `layer` (output_attentions, every head
    and every query of the n x n matrix), its last `queries` rows summed over heads and rows."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(ids, output_attentions=True)
    finally:
        use_cake_attention(model, "sdpa")
    attention = out.attentions[layer][0].double()  # [H, n, n]
    return attention[:, -queries:, :].sum(dim=(0, 1))


def reference_top(scores: list[float], protect_from: int, tokens: int, sinks: int) -> tuple[int, ...]:
    """Kept indices by a plain Python sort of the candidates (score descending, then index)."""
    n = len(scores)
    candidates = sorted(range(sinks, protect_from), key=lambda j: (-scores[j], j))[:tokens]
    return tuple(sorted(set(range(sinks)) | set(candidates) | set(range(protect_from, n))))


@pytest.mark.parametrize(
    "arch, layer, queries, n",
    [("llama", 1, 6, 57), ("llama", 0, 1, 30), ("llama", 3, 40, 40), ("qwen2", 2, 8, 64), ("qwen3", 1, 5, 45)],
)
def test_scores_equal_the_layers_full_attention(arch, layer, queries, n):
    model = tiny_llama() if arch == "llama" else tiny_family(arch)
    use_cake_attention(model, "sdpa")
    ids = ids_of(n, seed=n)
    ours = selection_scores(model, ids, layer, queries)
    ref = reference_scores(model, ids, layer, queries)
    assert ours.dtype == torch.float32 and ours.shape == (n,)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)
    assert ours.sum().item() == pytest.approx(model.config.num_attention_heads * min(queries, n), rel=1e-5)
    protect_from, tokens, sinks = n - 7, 12, 3
    kept = top_tokens(ours, protect_from, tokens, sinks)
    assert kept == reference_top(ref.tolist(), protect_from, tokens, sinks)
    assert len(kept) == sinks + tokens + 7


@pytest.mark.parametrize(
    "arch, layer, queries, n, p",
    [("llama", 1, 6, 57, 40), ("llama", 2, 8, 30, 27), ("qwen2", 2, 8, 64, 60), ("qwen2", 0, 3, 50, 10)],
    ids=["rest-holds-window", "window-reaches-into-prefix", "qwen2-short-rest", "qwen2-long-rest"],
)
def test_scores_after_a_shared_prefix_equal_the_whole_prompts(arch, layer, queries, n, p):
    model = tiny_llama() if arch == "llama" else tiny_family(arch)
    use_cake_attention(model, "sdpa")
    ids = ids_of(n, seed=n + p)
    prefix = prefix_cache(model, ids[:, :p])
    before = [layer_.keys.clone() for layer_ in prefix.layers]
    ours = selection_scores(model, ids, layer, queries, prefix=prefix)
    torch.testing.assert_close(ours.double(), reference_scores(model, ids, layer, queries), atol=1e-5, rtol=1e-5)
    assert all(torch.equal(a.keys, b) for a, b in zip(prefix.layers, before))  # the prefix is left as it was
    assert prefix.layers[0].seen == p
    with pytest.raises(ValueError, match="not shorter"):
        selection_scores(model, ids[:, :p], layer, queries, prefix=prefix)


def test_selection_keeps_sinks_question_and_order():
    model = tiny_llama()
    use_cake_attention(model, "sdpa")
    ids = ids_of(80, seed=3)
    sel = select_tokens(model, ids, protect_from=70, tokens=20, layer=2, sinks=4)
    assert sel.layer == 2 and sel.prompt_tokens == 80
    assert list(sel.kept) == sorted(sel.kept) and len(sel.kept) == 4 + 20 + 10
    assert set(range(4)) | set(range(70, 80)) <= set(sel.kept)
    assert sel.ids(ids).tolist() == [[ids[0, j].item() for j in sel.kept]]
    assert default_layer(32) == 13 and default_layer(24) == 9 and default_layer(2) == 0


@pytest.mark.parametrize("config", [None, CakeConfig(budget=24, window=4)], ids=["full", "cake"])
def test_keeping_every_token_is_the_normal_prefill(config):
    model = tiny_llama()
    use_cake_attention(model, "sdpa")
    ids = ids_of(60, seed=5)
    sel = select_tokens(model, ids, protect_from=50, tokens=46, layer=1)  # 46 >= the 46 candidates
    assert sel.kept == tuple(range(60))
    plain = generate(model, ids, config, max_new_tokens=6)
    chosen = generate(model, sel.ids(ids), config, max_new_tokens=6)
    assert chosen.token_ids == plain.token_ids
    assert torch.equal(chosen.first_logits, plain.first_logits)
    # and fewer tokens do change what the model reads
    fewer = select_tokens(model, ids, protect_from=50, tokens=10, layer=1)
    assert len(fewer.kept) == 4 + 10 + 10


def test_bad_settings_are_refused():
    model = tiny_llama()
    use_cake_attention(model, "sdpa")
    ids = ids_of(20, seed=1)
    with pytest.raises(ValueError, match="within 0..3"):
        selection_scores(model, ids, 4)
    with pytest.raises(ValueError, match="bad selection"):
        top_tokens(torch.zeros(5), 6, 1)
    gemma = tiny_family("gemma3_text")
    use_cake_attention(gemma, "sdpa")
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        selection_scores(gemma, ids, 0)
