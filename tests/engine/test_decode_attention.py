"""The CPU decode attention (one query: two batched products, float32 scores) against the backend
path it replaces (transformers' SDPA / eager with the layer's mask), and a tiny model's decode logits
with it against the model's own attention."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cake_cli.engine.attention import _backend_call, _make, fast_decode
from cake_cli.engine.generate import generate
from tests.helpers.models import tiny_llama


def _module(heads: int, kv_heads: int):
    return SimpleNamespace(layer_idx=0, is_causal=True, num_key_value_groups=heads // kv_heads, training=False)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("keys", [1, 7, 300])
def test_decode_query_matches_the_backend(backend, dtype, tol, keys):
    g = torch.Generator().manual_seed(keys)
    heads, kv_heads, dim = 14, 2, 64
    query = (torch.randn(1, heads, 1, dim, generator=g) * 2).to(dtype)
    key = (torch.randn(1, kv_heads, keys, dim, generator=g) * 2).to(dtype)
    value = torch.randn(1, kv_heads, keys, dim, generator=g).to(dtype)
    module = _module(heads, kv_heads)
    scaling = dim**-0.5
    assert fast_decode(backend, query.device, keys, None)
    fast, _ = _make(backend)(module, query, key, value, None, scaling=scaling)
    old, _ = _backend_call(backend, module, query, key, value, scaling, 0.0, None, None, {})
    assert fast.shape == old.shape == (1, 1, heads, dim) and fast.dtype == dtype
    # the slow reference: float64 softmax(q k^T s) v, query head h reading KV head h // 7
    k64 = key.double()[0].repeat_interleave(heads // kv_heads, dim=0)  # [H, k, d]
    v64 = value.double()[0].repeat_interleave(heads // kv_heads, dim=0)
    probs = torch.softmax(query.double()[0] @ k64.transpose(1, 2) * scaling, dim=-1)  # [H, 1, k]
    ref = (probs @ v64).transpose(0, 1).unsqueeze(0)  # [1, 1, H, d]
    err_fast, err_old = (fast.double() - ref).abs().max(), (old.double() - ref).abs().max()
    assert err_fast <= tol and err_fast <= 2 * err_old + tol / 2  # about as exact as the old path


def test_a_windowed_layer_past_its_window_keeps_the_backend():
    assert not fast_decode("sdpa", torch.device("cpu"), 9, 8)
    assert fast_decode("sdpa", torch.device("cpu"), 8, 8)
    assert not fast_decode("flash_attention_2", torch.device("cpu"), 8, None)


def test_full_cache_decode_logits_match_the_plain_model():
    """Teacher-forced decode through the CAKE engine (full cache: the fast path at every step)
    equals the model's own attention, step by step."""
    from cake_cli.engine.attention import use_cake_attention

    model = tiny_llama()
    ids = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(1))
    forced = torch.randint(0, 97, (8,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        plain = model(torch.cat([ids, torch.tensor([forced[:-1]])], dim=1)).logits[0, 19:]  # [8, V]
    use_cake_attention(model, "sdpa")
    steps: list = []
    generate(model, ids, None, max_new_tokens=8, forced_tokens=forced, step_logits=steps)
    got = torch.cat(steps)  # [8, V]: the prefill's logits, then 7 decode steps'
    assert torch.allclose(got, plain, atol=1e-4, rtol=1e-4)


class _Recorder:
    """A stand-in CakeCache that asks for the last `rows` query rows and records what it is handed."""

    def __init__(self, rows: int):
        self.rows, self.probs = rows, None
        self.layers = [SimpleNamespace(window=None, start=None, seen=0)]  # one global layer, no padding

    def window_rows(self, layer_idx, key_len):
        return self.rows

    def after_attention(self, layer_idx, query, key, scaling, probs=None, softcap=None):
        self.probs = probs


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("q_len,keys", [(9, 300), (40, 40), (33, 500)])
def test_window_rows_split_matches_the_backend_and_hands_over_their_probabilities(backend, dtype, tol, q_len, keys):
    """`split_attention`: the last 8 rows by window_attention + attend, the rest by the backend, against a
    float64 reference (cached keys visible, new queries causal); the probabilities handed to the cache are
    the window's rows of the same reference (q = k: a whole prompt)."""
    from cake_cli.engine.attention import window_split
    from cake_cli.engine.window import window_attention

    g = torch.Generator().manual_seed(q_len + keys)
    heads, kv_heads, dim, rows = 14, 2, 64, 8
    query = (torch.randn(1, heads, q_len, dim, generator=g) * 2).to(dtype)
    key = (torch.randn(1, kv_heads, keys, dim, generator=g) * 2).to(dtype)
    value = torch.randn(1, kv_heads, keys, dim, generator=g).to(dtype)
    module, scaling, cake = _module(heads, kv_heads), dim**-0.5, _Recorder(rows)
    assert window_split(cake, 0, backend, query, key) == rows
    assert window_split(_Recorder(q_len), 0, backend, query, key) == 0, "every row a window row: no split"
    out, _ = _make(backend)(module, query, key, value, None, scaling=scaling, cake=cake)
    k64 = key.double()[0].repeat_interleave(heads // kv_heads, dim=0)  # [H, k, d]
    v64 = value.double()[0].repeat_interleave(heads // kv_heads, dim=0)
    logits = query.double()[0] @ k64.transpose(1, 2) * scaling  # [H, q, k]
    future = torch.arange(keys)[None, :] > torch.arange(keys - q_len, keys)[:, None]  # [q, k]
    probs = torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1)
    ref = (probs @ v64).transpose(0, 1).unsqueeze(0)  # [1, q, H, d]
    assert out.shape == (1, q_len, heads, dim) and out.dtype == dtype
    old, _ = _backend_call(backend, module, query, key, value, scaling, 0.0, None, None, {})  # every row by it
    err_split, err_old = (out.double() - ref).abs().max(), (old.double() - ref).abs().max()
    assert err_split <= 2 * err_old + tol / 2  # about as exact as the backend alone (bf16 eager rounds its weights)
    assert (out[:, -rows:].double() - ref[:, -rows:]).abs().max() <= tol, "the window rows: float32 probabilities"
    torch.testing.assert_close(cake.probs.double(), probs[:, -rows:], atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(cake.probs, window_attention(query[0, :, -rows:], key[0], scaling), atol=0, rtol=0)
