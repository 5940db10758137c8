"""`cake bench speed --prefill-once` and `--rss`: decode repeats from one prefill, and the process
memory lines (synthetic rows; the engine part on the tiny model)."""

from __future__ import annotations

import copy

import pytest
import torch

from cake_cli.bench.speed.rows import TIMED, config_for, decode_interleaved, run_speed
from cake_cli.bench.speed.rss import MemoryRow, memory_lines
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import Decoding, decode, prefill
from cake_cli.errors import CakeError
from cake_cli.tasks.threads import Threads
from tests.helpers.cli import invoke


def test_prefill_once_decodes_every_repeat_from_the_same_state(tiny_model):
    """The row has one prefill sample and `repeats` decode samples, and its cache sizes and decode
    steps equal those of a row that prefilled every time (each repeat decoded a copy of the state)."""
    use_cake_attention(tiny_model, "sdpa")
    ids = torch.randint(0, 97, (120,), generator=torch.Generator().manual_seed(0)).tolist()
    base = CakeConfig(budget=24, window=6)
    kwargs = dict(group="tiny · engine", lengths=[120], methods=["cake"], threads=Threads(1, 1, "test"), new_tokens=6)
    once = run_speed(tiny_model, ids, base, repeats=3, prefill_once=True, **kwargs)
    each = run_speed(tiny_model, ids, base, repeats=3, **kwargs)
    for a, b in zip(once, each):
        assert len(a.samples["decode_tokens_per_second"]) == 3
        assert len(a.samples["prefill_seconds"]) == 1  # the cake row and the limit row alike
        assert len(b.samples["prefill_seconds"]) == 3
        assert (a.kv_bytes_kept, a.kv_bytes_full, a.decode_steps) == (b.kv_bytes_kept, b.kv_bytes_full, b.decode_steps)


def test_repeats_run_in_rounds_of_every_case(tiny_model):
    """Each round runs every case once (so a slow spell of the machine falls on all cases of a round),
    after every case's one prefill with `prefill_once`; the rows of one call share a rounds id."""
    use_cake_attention(tiny_model, "sdpa")
    ids = torch.randint(0, 97, (120,), generator=torch.Generator().manual_seed(1)).tolist()
    base = CakeConfig(budget=24, window=6)
    seen: list[str] = []
    kwargs = dict(lengths=[120], methods=["cake", "full"], threads=Threads(1, 1, "test"), new_tokens=4)
    rows = run_speed(tiny_model, ids, base, group="t", repeats=2, prefill_once=True, on_case=seen.append, **kwargs)
    cases = ["cake @ 120", "full @ 120", "limit @ 24"]
    rounds = [
        [f"t: {c} tokens, run {r}/2" for c in cases] + [f"t: decoding 3 cases in turn, run {r}/2"] for r in (1, 2)
    ]
    assert seen == [f"t: {c} tokens, prefill" for c in cases] + rounds[0] + rounds[1]
    assert [r.method for r in rows] == ["cake", "full", "limit"]
    assert len({r.rounds for r in rows}) == 1 and rows[0].rounds
    again = run_speed(tiny_model, ids, base, group="t", repeats=2, **kwargs)
    assert again[0].rounds not in ("", rows[0].rounds)  # another call: not paired with this one


def test_interleaved_decoding_steps_every_case_in_turn_and_decodes_as_alone(tiny_model):
    """`decode_interleaved` runs one forward of each case per turn (no case takes a second step before
    every other took one, the first to step rotating) and gives each case the tokens, steps and KV
    bytes it gets decoded alone; a case that stops early (fewer new tokens) leaves the others running."""
    use_cake_attention(tiny_model, "sdpa")
    ids = torch.randint(0, 97, (1, 90), generator=torch.Generator().manual_seed(2))
    threads = Threads(1, 1, "test")
    configs = [CakeConfig(budget=24, window=6), None, config_for("snapkv", CakeConfig(budget=30, window=6))]
    lengths = [90, 90, 60]
    cases = [(ids[:, :n], prefill(tiny_model, ids[:, :n], c, collect_stats=False), c) for n, c in zip(lengths, configs)]
    alone = [
        decode(tiny_model, i, copy.deepcopy(s), c, max_new_tokens=6) for i, s, c in cases
    ]  # the oracle: each decoded on its own
    order: list[int] = []
    caches = {id(s.cache): k for k, (_, s, _) in enumerate(cases)}
    hook = tiny_model.register_forward_pre_hook(
        lambda mod, args, kwargs: order.append(caches[id(kwargs["cache"])]), with_kwargs=True
    )
    try:
        together = decode_interleaved(tiny_model, cases, 6, threads)
    finally:
        hook.remove()
    assert order[:6] == [0, 1, 2, 1, 2, 0]  # the first to step rotates
    for turn in range(0, len(order), 3):
        assert sorted(order[turn : turn + 3]) == [0, 1, 2]
    assert len(order) == 3 * 5  # 6 new tokens: 5 forward passes each
    for a, b in zip(together, alone):
        assert a.token_ids == b.token_ids
        assert (a.decode_steps, a.kv_bytes_final, a.stop_reason) == (b.decode_steps, b.kv_bytes_final, b.stop_reason)


def test_a_decoding_has_no_result_before_it_ends(tiny_model):
    """`Decoding.result()` before `step()` returned False is refused in one line."""
    use_cake_attention(tiny_model, "sdpa")
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(3))
    run = Decoding(tiny_model, ids, prefill(tiny_model, ids, None), None, max_new_tokens=3)
    assert run.step()
    with pytest.raises(RuntimeError, match="has not ended"):
        run.result()
    while run.step():
        pass
    assert len(run.result().token_ids) == 3 and not run.step()


def _memory(cake: int, llama: int, length: int = 32000) -> list[MemoryRow]:
    mib = 2**20
    return [
        MemoryRow("qwen", "cake", length, cake * mib, cake * mib // 2, 10.0),
        MemoryRow("qwen", "llama.cpp", length, llama * mib, llama * mib // 2, 20.0),
    ]


def test_memory_lines_compare_the_two_processes():
    (fail,) = memory_lines(_memory(cake=1500, llama=1000))
    assert fail.startswith("FAIL qwen at 32000 tokens") and "1500 MiB, 1.50x llama.cpp's 1000 MiB" in fail
    (ok,) = memory_lines(_memory(cake=900, llama=1000))
    assert ok.startswith("PASS") and "0.90x" in ok and "while running 450 vs 500 MiB" in ok
    assert memory_lines(_memory(900, 1000)[:1]) == []  # no llama.cpp process: nothing to compare


def test_rss_without_llama_is_a_usage_error():
    result = invoke("bench", "speed", "--rss")
    assert result.exit_code == 2 and "add --llama" in result.stderr and result.stdout == ""


def test_lengths_all_past_the_prompt_limit_are_one_usage_line(cli_env):
    """Known only once the model is loaded: after the progress line, one error line and exit 2."""
    result = invoke("bench", "speed", "-m", "tiny-test", "--lengths", "5000", "--methods", "cake", "--cli-tasks", "")
    assert result.exit_code == 2 and result.stdout == "" and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: tiny-test takes prompts of at most 1500 tokens; --lengths asks only for longer ones — ask for "
        "--lengths 1500 or less"
    ]


class _Other:
    """A `rows.RoundEngine` that records when it runs and returns fixed measurements."""

    method, group = "other", "t · other"

    def __init__(self, seen: list[str]):
        self.seen = seen

    def measure(self, length: int) -> dict:
        self.seen.append(f"other {length}")
        counts = dict.fromkeys(
            ("decode_steps", "kv_bytes_kept", "kv_peak_prefill", "kv_bytes_full", "rss_peak_delta"), 0
        )
        return dict.fromkeys(TIMED, 1.0) | counts


def test_another_engine_runs_at_the_end_of_every_round_and_shares_its_rounds(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    ids = torch.randint(0, 97, (200,), generator=torch.Generator().manual_seed(4)).tolist()
    seen: list[str] = []
    rows = run_speed(
        tiny_model, ids, CakeConfig(budget=24, window=6), group="t", lengths=[60, 120], methods=["cake"],
        threads=Threads(1, 1, "test"), new_tokens=4, repeats=2, on_case=seen.append, others=[_Other(seen)],
    )  # fmt: skip
    decoding = [i for i, s in enumerate(seen) if "decoding" in s]
    others = [i for i, s in enumerate(seen) if s.startswith("other")]
    assert len(decoding) == 2 and len(others) == 4  # two lengths, two rounds
    assert decoding[0] < others[0] < others[1] < decoding[1] < others[2]  # after each round's decoding
    assert [(r.method, r.length) for r in rows[-2:]] == [("other", 60), ("other", 120)]
    assert rows[-1].group == "t · other" and rows[-1].budget is None
    assert len({r.rounds for r in rows}) == 1 and rows[0].rounds and rows[-1].repeats == 2


class _Failing(_Other):
    """Fails on its second run."""

    def measure(self, length: int) -> dict:
        if self.seen:
            raise CakeError("llama.cpp failed: out of memory")
        return super().measure(length)


def test_another_engine_that_fails_is_left_out_with_one_line_and_ours_are_kept(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    ids = torch.randint(0, 97, (200,), generator=torch.Generator().manual_seed(4)).tolist()
    warnings: list[str] = []
    rows = run_speed(
        tiny_model, ids, CakeConfig(budget=24, window=6), group="t", lengths=[60], methods=["cake"],
        threads=Threads(1, 1, "test"), new_tokens=4, repeats=3, others=[_Failing([])], warn=warnings.append,
    )  # fmt: skip
    assert [r.method for r in rows] == ["cake", "limit"] and rows[0].repeats == 3
    assert warnings == ["other: llama.cpp failed: out of memory; its rows are left out"]


def test_cake_chunk_is_timed_beside_cake_with_the_same_budgets(tiny_model):
    """`--methods cake,cake-chunk`: CAKE's allocation is shared, so both rows keep the same bytes and
    decode the same steps; only the token indicator differs. The default list leaves cake-chunk out
    (it is not the paper's method)."""
    from cake_cli.bench.suites import SPEED_DEFAULT, SPEED_METHODS

    use_cake_attention(tiny_model, "sdpa")
    ids = torch.randint(0, 97, (160,), generator=torch.Generator().manual_seed(1)).tolist()
    rows = run_speed(
        tiny_model,
        ids,
        CakeConfig(budget=40, window=6),
        group="tiny · engine",
        lengths=[160],
        methods=["cake", "cake-chunk"],
        threads=Threads(1, 1, "test"),
        new_tokens=5,
        repeats=1,
    )
    by = {r.method: r for r in rows}
    assert {"cake", "cake-chunk"} <= set(by)
    assert by["cake-chunk"].kv_bytes_kept == by["cake"].kv_bytes_kept < by["cake"].kv_bytes_full
    assert by["cake-chunk"].decode_steps == by["cake"].decode_steps == 4
    assert config_for("cake-chunk", CakeConfig(budget=40, window=6)).indicator == "chunk"
    assert "cake-chunk" in SPEED_METHODS and "cake-chunk" not in SPEED_DEFAULT
