"""The two engine oracles as functions, shared by the Llama tests and the family tests.

- no eviction (budget >= prompt + answer) = plain transformers generation with the model's own
  attention and cache;
- eviction = the masking reference (`tests.helpers.reference.MaskedReference`) at every decode step, and
  the comparison can fail (the full cache gives other logits);
- a replay of one recording = the live prefill of the same config (`check_replay`).
"""

from __future__ import annotations

import torch

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import GenerationResult, decode, generate, prefill
from cake_cli.engine.replay import record, replay
from tests.helpers.models import kept_per_layer
from tests.helpers.reference import MaskedReference


def check_no_eviction(model, ids: torch.Tensor, new: int, policy: str, plain_attention: str = "sdpa") -> str:
    """Engine generation with a budget nothing is evicted under = `model.generate` (greedy, `new`
    tokens, no EOS stop: the model's generation_config has none), first logits within 1e-5.

    Returns:
        The backend the engine used (`use_cake_attention` with SDPA asked for).
    """
    n = ids.shape[1]
    model.set_attn_implementation(plain_attention)
    plain = model.generate(ids, max_new_tokens=new, do_sample=False)
    plain_logits = model(ids).logits[:, -1].float()
    backend = use_cake_attention(model, "sdpa")
    result = generate(model, ids, CakeConfig(budget=n + new, window=8, decode_policy=policy), max_new_tokens=new)
    assert not result.evicted
    assert list(result.token_ids) == plain[0, n:].tolist()
    torch.testing.assert_close(result.first_logits, plain_logits, atol=1e-5, rtol=0)
    assert result.kv_bytes_kept == result.kv_bytes_full
    return backend


def check_eviction(
    model, ids: torch.Tensor, config: CakeConfig, new: int, backend: str
) -> tuple[GenerationResult, MaskedReference]:
    """Engine generation under eviction = the masking reference at every decode step (1e-4), with
    the same budgets; and the full cache differs (> 1e-3), so the comparison can fail.

    Returns:
        The engine's result and the reference (for further checks).
    """
    use_cake_attention(model, backend)
    engine_logits: list[torch.Tensor] = []
    result = generate(model, ids, config, max_new_tokens=new, step_logits=engine_logits)
    assert result.evicted and result.kv_bytes_kept < result.kv_bytes_full
    budgets = [row.budget for row in result.layers]
    assert len({b for b in budgets if b is not None}) > 1, "allocation should differ across layers to mean something"
    reference = MaskedReference(model, config)
    ref_logits = reference.run(ids, list(result.token_ids))
    assert reference.budgets == budgets
    assert len(ref_logits) == len(engine_logits) == new
    for step, (got, want) in enumerate(zip(engine_logits, ref_logits)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0, msg=f"decode step {step}")
    full_logits: list[torch.Tensor] = []
    generate(model, ids, None, max_new_tokens=new, forced_tokens=list(result.token_ids), step_logits=full_logits)
    assert max(float((a - b).abs().max()) for a, b in zip(full_logits[1:], engine_logits[1:])) > 1e-3
    return result, reference


def check_replay(model, ids: torch.Tensor, config: CakeConfig, new: int = 5) -> tuple:
    """A replay of `model`'s recording of `ids` (window `config.window`) under `config` = the live prefill: the
    same tokens kept per layer and KV head, lengths, final budgets and layer statistics, and the same `new` greedy
    tokens decoded from each. The model's attention must already be switched (`use_cake_attention`).

    Returns:
        (the recording, its replay under `config`), for a test that replays it again.
    """
    rec = record(model, ids, window=config.window)
    live = prefill(model, ids, config)
    again = replay(rec, config)
    assert kept_per_layer(again) == kept_per_layer(live) and again.lengths == live.lengths
    assert again.cascade.final_budgets == live.cascade.final_budgets
    assert again.cascade.stats == live.cascade.stats
    a = decode(model, ids, live, config, max_new_tokens=new)
    b = decode(model, ids, again, config, max_new_tokens=new)
    assert a.token_ids == b.token_ids
    return rec, again
