"""Per-KV-head lengths (`engine.headlengths`) and KVzip's global ranking (`--allocation global`): the ranking
against a sorted list, the kept pairs against the reconstruction scores, real bytes from the padded tensors,
and every decode step's logits against the per-head masking reference (`tests.helpers.headmask`) for every
family the engine accepts (GQA, local sliding layers, soft-capping), both backends, both decode policies."""

from __future__ import annotations

import pytest
import torch

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.cachefile import cache_from_tensors, cache_tensors, requantized
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.continuation import continue_prefix
from cake_cli.engine.generate import decode
from cake_cli.engine.headlengths import ranked_selection
from cake_cli.engine.reconstruct import compress_by_reconstruction, reconstruction_scores
from tests.helpers.headmask import HeadMaskReference
from tests.helpers.models import cached_models, ids_of

CASES = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "gemma3": ("gemma3_text", {"layers": 6}),  # local, local, global, local, local, global
    "gemma2": ("gemma2", {}),  # local, global, local, global; soft-capping (eager)
    "phi3": ("phi3", {}),
    "mistral-sliding": ("mistral", {"sliding_window": 96}),  # every layer slides; exact below 96 tokens
}
model = cached_models(CASES)


def kept_positions(cache) -> list[list[set[int]] | None]:
    """Per layer, per KV head, the prefix positions the engine holds (None: a local layer)."""
    out = []
    for layer in cache.layers:
        if layer.window is not None:
            out.append(None)
            continue
        out.append([{p for p in layer.positions[h].tolist() if p >= 0} for h in range(layer.positions.shape[0])])
    return out


def test_ranked_selection_is_the_top_k_of_a_sorted_list():
    g = torch.Generator().manual_seed(3)
    scores = [torch.randint(0, 5, (2, m), generator=g).float() for m in (7, 3, 9)]  # many ties
    for total in (0, 1, 10, 25, 38, 100):
        pairs = [(-float(s[h, j]), li, h, j) for li, s in enumerate(scores) for h in range(2) for j in range(len(s[0]))]
        want = set(tuple(p[1:]) for p in sorted(pairs)[:total])  # ties: lower (layer, head, index)
        got = ranked_selection(scores, total)
        assert {(li, h, int(j)) for li, heads in enumerate(got) for h, js in enumerate(heads) for j in js} == want
        assert all(bool((js.diff() > 0).all()) for heads in got for js in heads)


def test_global_keeps_the_top_scores_over_layers_and_heads_and_measures_real_bytes():
    m, prefix, repeat = model("llama"), ids_of(60, 1), ids_of(4, 2)
    config = CakeConfig(budget=20, window=4, allocation="global")
    use_cake_attention(m, "sdpa")
    state = compress_by_reconstruction(m, prefix, repeat, prefix, config, chunk=16)
    from cake_cli.engine.generate import prefill

    rec = reconstruction_scores(m, prefill(m, prefix, None).cache, repeat, prefix, config, chunk=16)
    flat = [(-float(s[h, j]), li, h, j) for li, s in enumerate(rec.scores) for h in range(2) for j in range(56)]
    chosen = {p[1:] for p in sorted(flat)[: 2 * (20 - 4) * 4]}  # H_kv · B_total
    kept = kept_positions(state.cache)
    for li, heads in enumerate(kept):
        for h, positions in enumerate(heads):
            assert positions == {j for (lj, hj, j) in chosen if (lj, hj) == (li, h)} | set(range(56, 60))
    counts = [len(p) for heads in kept for p in heads]
    assert len({len(heads[0]) for heads in kept}) > 1, "layers should get unequal shares"
    assert any(len(heads[0]) != len(heads[1]) for heads in kept), "KV heads should get unequal shares"
    assert sum(counts) == 2 * 16 * 4 + 2 * 4 * 4
    bytes_each = 2 * 8 * 4  # keys + values, d = 8, float32
    longest = [max(len(p) for p in heads) for heads in kept]
    assert state.kv_bytes == sum(2 * bytes_each * n for n in longest)  # padded to each layer's longest head only
    assert state.cache.head_lengths() == [[len(p) for p in heads] if len({len(p) for p in heads}) > 1 else None
                                          for heads in kept]  # fmt: skip


@pytest.mark.parametrize("policy", ["fixed", "grow"])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_decode_step_equals_the_per_head_masking_reference(case, backend, policy):
    m, prefix, question, new = model(case), ids_of(48, 5), ids_of(5, 6), 8
    config = CakeConfig(budget=18, window=4, allocation="global", decode_policy=policy)
    use_cake_attention(m, backend)
    state = compress_by_reconstruction(m, prefix, ids_of(3, 7), prefix, config, chunk=20)
    assert state.cache.ragged()
    kept = kept_positions(state.cache)
    ids = torch.cat([prefix, question], dim=1)
    cont, capacity = continue_prefix(m, state, ids, config)
    steps: list[torch.Tensor] = []
    result = decode(m, ids, cont, config, capacity=capacity, max_new_tokens=new, step_logits=steps)
    engine = [cont.logits.float(), *steps]
    reference = HeadMaskReference(m, kept, prefix.shape[1], config.window, policy).run(
        prefix, question, list(result.token_ids)
    )
    assert len(engine) == len(reference) == new
    for step, (got, want) in enumerate(zip(engine, reference)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0, msg=f"step {step}")
    everything = HeadMaskReference(m, [None] * len(kept), prefix.shape[1], config.window, "grow")
    full = everything.run(prefix, question, list(result.token_ids))
    assert max(float((a - b).abs().max()) for a, b in zip(full, engine)) > 1e-3  # the comparison can fail


def test_flash_attention_is_refused_on_a_ragged_cache():
    m, prefix = model("llama"), ids_of(40, 8)
    config = CakeConfig(budget=16, window=4, allocation="global")
    use_cake_attention(m, "sdpa")
    state = compress_by_reconstruction(m, prefix, ids_of(3, 9), prefix, config, chunk=20)
    from cake_cli.engine.attention import _backend_call

    layer = next(i for i, x in enumerate(state.cache.layers) if x.start is not None)
    module = m.model.layers[layer].self_attn
    key = state.cache.layers[layer].keys
    live = torch.ones(key.shape[1], key.shape[2], dtype=torch.bool)
    with pytest.raises(ValueError, match="flash_attention_2 cannot mask"):
        _backend_call("flash_attention_2", module, torch.zeros(1, 8, 1, 8), key, key, 1.0, 0.0, None, None, {}, live)


@pytest.mark.parametrize("bits", [16, 8, 4])
def test_a_ragged_cache_through_file_tensors_answers_as_in_process(bits):
    m, prefix, question = model("qwen3"), ids_of(48, 10), ids_of(4, 11)
    config = CakeConfig(budget=18, window=4, allocation="global")
    use_cake_attention(m, "sdpa")
    state = compress_by_reconstruction(m, prefix, ids_of(3, 12), prefix, config, chunk=20)
    in_process = requantized(state, bits, recent=4)
    tensors = {k: v.clone() for k, v in cache_tensors(state.cache, bits, recent=4).items()}
    loaded = cache_from_tensors(tensors, len(state.cache.layers), 48, "cpu", state.cache.windows, bits=bits)
    assert loaded.head_lengths() == state.cache.head_lengths()
    ids = torch.cat([prefix, question], dim=1)
    runs = []
    for cache in (in_process.cache, loaded):
        from dataclasses import replace

        s = replace(state, cache=cache, lengths=cache.lengths())
        cont, capacity = continue_prefix(m, s, ids, config)
        runs.append(decode(m, ids, cont, config, capacity=capacity, max_new_tokens=6).token_ids)
    assert runs[0] == runs[1]
    if bits == 16:
        for a, b in zip(state.cache.layers, loaded.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.positions, b.positions)


def test_damaged_starts_are_refused():
    m, prefix = model("llama"), ids_of(40, 13)
    use_cake_attention(m, "sdpa")
    config = CakeConfig(budget=16, window=4, allocation="global")
    state = compress_by_reconstruction(m, prefix, ids_of(3, 14), prefix, config, chunk=20)
    tensors = cache_tensors(state.cache)
    name = next(k for k in tensors if k.startswith("starts."))
    bad = dict(tensors)
    bad[name] = tensors[name] + 1  # a padding slot claimed live, or past the slots
    with pytest.raises(ValueError, match="positions|slots"):
        cache_from_tensors(bad, len(state.cache.layers), 40, "cpu", state.cache.windows)
