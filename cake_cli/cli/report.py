"""Rich views of the result objects: the run report (stderr), the layer inspector (stdout), and
the per-layer allocation chart both share. Every number shown comes from the result dataclass
that --json prints, so the two never disagree.

Every cell is a `rich.text.Text`, never markup, so file names, answers and hints print as they are
(`meeting[v2].txt` stays whole). On a narrow console the bar chart goes before any number does.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cake_cli.tasks.results import (
    BITS_GIVEN,
    CacheInfo,
    CompressResult,
    InspectResult,
    LayerResult,
    Location,
    PrefillSummary,
    RunResult,
    human_bytes,
)
from cake_cli.tasks.templates import load_template

BAR_WIDTH = 30
STOPS = {  # GenerationResult.stop_reason -> what the report says
    "eos": "the model's end of answer",
    "max_new_tokens": "the --max-new-tokens limit",
    "max_positions": "the model's position limit (or the sliding window every layer uses)",
    "repetition": "a loop: the answer began repeating itself",
    "complete": "the task: it had what it needed (e.g. --lines lines of code)",
}
NUMBERS_WIDTH = 52  # cells the layer table's number columns need; the bar chart gets what is left


def bar(value: float, top: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of `width` cells at most, in eighth-cell steps."""
    if top <= 0 or value <= 0 or width <= 0:
        return ""
    eighths = round(value / top * width * 8)
    return "█" * (eighths // 8) + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[eighths % 8]


def _grid() -> Table:
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column(overflow="fold")
    return t


def _row(t: Table, key: str, *parts: str | Text) -> None:
    t.add_row(key, Text.assemble(*parts))


def _settings_rows(t: Table, r: PrefillSummary, method: str | None) -> None:
    """The model, prompt, budget and taus rows (fields both result types have)."""
    _row(t, "model", f"{r.model} · {r.device} · {r.dtype} ({r.dtype_reason}) · attention {r.attention}")
    if r.weights != "bf16" or r.weights_reason.startswith("auto"):
        _row(t, "weights", f"{r.weights} linear layers · {r.weights_reason}")
    prompt = f"{r.prompt_tokens} tokens · {r.document_tokens} of them the document"
    if r.document_tokens < r.original_document_tokens:
        prompt += f", middle-truncated from {r.original_document_tokens}"
    _row(t, "prompt", prompt)
    if r.budget is None:  # --method full
        _row(t, "budget", Text("full cache: nothing scored or evicted (--method full)", style="yellow"))
        return
    if r.budget >= r.prompt_tokens:
        budget = f"B = {r.budget} tokens/layer, not below the {r.prompt_tokens}-token prompt: nothing evicted"
    else:
        budget = f"B = {r.budget} tokens/layer ({r.budget / r.prompt_tokens:.1%} of the prompt)"
    budget += f", window w = {r.window}"
    if method is not None:
        budget += f" · method {method}"
    _row(t, "budget", budget)
    _row(t, "taus", f"tau1 = {r.tau1:.3g}, tau2 = {r.tau2:.3g} ({r.tau_rule}); gamma = {r.gamma:g}")


def location_text(loc: Location | None) -> Text:
    """'page 3 · characters 7049-7144 (50.6% deep) · similarity 93 · "…"' or 'not found'."""
    if loc is None:
        return Text("not found in the document (see the warning)", style="yellow")
    where = f"page {loc.page} · " if loc.page is not None else ""
    quote = loc.text[:60] + ("…" if len(loc.text) > 60 else "")
    return Text(
        f"{where}characters {loc.start}-{loc.end} ({loc.percent:.1f}% deep) · similarity {loc.similarity:.0f}"
        f' · "{quote}"'
    )


def _kv_row(t: Table, r: PrefillSummary, final: int | None) -> None:
    saved = Text(f"{r.saved_fraction:.1%} saved", style="bold green" if r.evicted else "yellow")
    after = f" · after decoding {human_bytes(final)}" if final is not None else ""
    _row(
        t,
        "KV cache",
        f"{human_bytes(r.kv_bytes_full)} full → {human_bytes(r.kv_bytes_kept)} kept after prefill · ",
        saved,
        f" · peak during prefill {human_bytes(r.kv_peak_prefill)}{after}",
    )


def _time_text(r: PrefillSummary) -> str:
    scoring = f" (scoring + eviction {r.eviction_seconds:.3f} s)" if r.budget is not None else ""
    cache = getattr(r, "cache", None)
    prefill = f"prefill of the {cache.continuation_tokens} task tokens" if cache is not None else "prefill"
    return f"load {r.load_seconds:.1f} s · {prefill} {r.prefill_seconds:.2f} s{scoring}"


def _threads_text(r: PrefillSummary) -> str:
    return f"prefill {r.prefill_threads}, decode {r.decode_threads} ({r.threads_reason})"


def summary_table(r: RunResult) -> Table:
    """The run report's rows: settings, KV memory, times, output (and the needle's location)."""
    t = _grid()
    method = None if r.allocation is None else f"{r.method} ({r.allocation} allocation + {r.indicator} indicator)"
    _settings_rows(t, r, method)
    if r.budget is not None:
        _row(t, "decoding", f"decode policy {r.decode_policy}")
    if r.selected is not None:
        s = r.selected
        _row(
            t,
            "prefill select",
            f"layer {s.layer}'s attention kept {s.kept_tokens} of {s.prompt_tokens} prompt tokens "
            f"({s.kept_tokens / s.prompt_tokens:.1%}, positions re-indexed) in {s.seconds:.2f} s, "
            "counted in the prefill time",
        )
    _kv_row(t, r, r.kv_bytes_final)
    _row(t, "time", f"{_time_text(r)} · decode {r.decode_tokens_per_second:.1f} tok/s over {r.decode_steps} steps")
    _row(t, "threads", _threads_text(r))
    _row(t, "output", f"{r.generated_tokens} tokens, stopped by {STOPS.get(r.stop_reason, r.stop_reason)}")
    if r.cache is not None:
        _row(t, "saved cache", cache_text(r.cache))
    if r.support is not None or load_template(r.task).locate:  # a template that cites its passage (qa, needle)
        t.add_row("location", support_text(r))
    if r.dropped is not None:
        t.add_row("not read", dropped_text(r))
    if r.sections:
        t.add_row("sections", sections_text(r))
    return t


def support_text(r: RunResult) -> Text:
    """The passage behind an answer: located (page, offsets, quote), unsupported (why) or abstained."""
    s = r.support
    if s is None or s.status == "located":
        return location_text(r.location)
    if s.status == "abstained":
        said = "abstained: the model says the document does not hold the answer"
        return Text(said + (f"; {s.reason}" if s.reason else ""), style="yellow" if s.reason else "")
    why = "not found in the document" if s.reason.startswith("no passage") else s.reason
    doubt = "" if s.abstain_probability is None else f"; its probability of abstaining {s.abstain_probability:.2f}"
    if s.withheld:
        said = f"WITHHELD, not supported by the document: {why}; the model answered {s.answer!r}{doubt}"
        return Text(said, style="bold yellow")
    return Text(f"UNSUPPORTED: {why}{doubt} (see the warning)", style="bold yellow")


def dropped_text(r: RunResult) -> Text:
    """What the middle cut left out of the prompt (the answer cannot come from there)."""
    d = r.dropped
    return Text(f"{d.tokens} document tokens cut from the middle: {d.describe()}; --long sections reads them", "yellow")


def sections_text(r: RunResult) -> Text:
    """--long sections: each section's pages or characters and whether its answer was kept."""
    parts = []
    for s in r.sections:
        where = f"pages {s.pages}" if s.pages else f"characters {s.start}-{s.end}"
        state = s.support.status if s.support is not None else "summarized"
        parts.append(f"{s.index}: {where} ({s.document_tokens} tokens) {state}{' · kept' if s.kept else ''}")
    return Text(f"{len(r.sections)} sections, each prefilled on its own · " + " · ".join(parts))


def layer_table(layers: tuple[LayerResult, ...], width: int, rows: str = "window rows") -> Table:
    """Per-layer dispersion, shift, preference share, budget and tokens kept, with a bar chart that
    shrinks (then goes) on a console narrower than the numbers plus BAR_WIDTH cells; `rows` names the
    attention rows H and V sum over (the observation window's, or a reconstruction's)."""
    bar_width = min(BAR_WIDTH, width - NUMBERS_WIDTH)
    t = Table(
        box=box.SIMPLE_HEAD,
        title="allocation across layers",
        title_justify="left",
        caption=f"H dispersion (nats, summed over heads and {rows}) · V shift · P preference share · "
        "B_l evictable budget · kept = B_l + w window tokens"
        + (" · local: a sliding-window layer, no budget" if _local(layers) else "")
        + (
            " · (a/b/…): tokens per KV head, unequal under --allocation global; B_l their mean minus w"
            if any(layer.heads for layer in layers)
            else ""
        ),
        caption_justify="left",
        pad_edge=False,
    )
    for name in ("layer", "H", "V", "P", "B_l", "kept"):
        t.add_column(name, justify="right", no_wrap=True)
    if bar_width >= 4:
        t.add_column("tokens kept", justify="left", style="magenta", no_wrap=True)
    top = max((layer.kept for layer in layers), default=0)
    for layer in layers:
        cells = [
            str(layer.layer),
            "–" if layer.dispersion is None else f"{layer.dispersion:.0f}",
            "–" if layer.shift is None else f"{layer.shift:.1e}",
            "–" if layer.preference_share is None else f"{layer.preference_share:.1%}",
            f"local {layer.window}" if layer.window else "all" if layer.budget is None else str(layer.budget),
            str(layer.kept) if layer.heads is None else f"{layer.kept} ({'/'.join(map(str, layer.heads))})",
        ]
        if bar_width >= 4:
            cells.append(bar(layer.kept, top, bar_width))
        t.add_row(*cells)
    return t


def _local(layers: tuple[LayerResult, ...]) -> bool:
    return any(layer.window for layer in layers)


def render(r: RunResult, console: Console) -> None:
    """Print the full report to `console` (stderr in the CLI); no layer chart for the full cache."""
    console.print(Panel(summary_table(r), title=f"CAKE report · {r.task}", title_align="left", border_style="cyan"))
    if r.budget is not None:
        console.print(layer_table(r.layers, console.width, _rows(r.cache.scoring if r.cache else None)))


def inspect_summary(r: InspectResult) -> Table:
    """The inspector's settings, the budget check and memory after prefill."""
    t = _grid()
    _row(t, "document", f"{r.document} (prompt of the {r.template} template)")
    _settings_rows(t, r, None)
    if r.evicted:
        lost = r.evictable_total - r.budget_sum
        _row(
            t,
            "budgets",
            f"sum of B_l = {r.budget_sum} of (B - w)·L = {r.evictable_total}: {lost} lost to integer rounding "
            f"(at most L = {sum(not layer.window for layer in r.layers)}"
            + (", global layers only)" if _local(r.layers) else ")"),
        )
    elif r.budget is not None:
        _row(t, "budgets", Text("the prompt fits the budget: nothing evicted, every layer keeps all tokens", "yellow"))
    _kv_row(t, r, None)
    _row(t, "time", _time_text(r))
    _row(t, "threads", _threads_text(r))
    return t


def render_inspect(r: InspectResult, console: Console) -> None:
    """Print the layer inspector's view (stdout in the CLI: it is the command's answer)."""
    console.print(Panel(inspect_summary(r), title="CAKE layer inspector", title_align="left", border_style="cyan"))
    console.print(layer_table(r.layers, console.width))


SCORING_TEXT = {  # CompressResult.scoring -> what the report says
    "question": "kept whole: each task evicts it to its budget with its own question in the observation window",
    "end": "observation window: the document's end (question-agnostic: evicted before any question)",
    "instruction": "observation window: a question-less instruction (question-agnostic: evicted before any question)",
    "none": "kept whole (--method full): a task may evict it with its own question and --budget",
    "reconstruct": "reconstruction: each token scored by the attention of the model repeating the document "
    "(question-agnostic: evicted before any question)",
}


def cache_text(c: CacheInfo) -> str:
    """The compressed prefix a run continued: compressed in this run (its prefill, once for every
    question), or loaded (its prefill when the file was made, the read now, the time saved)."""
    first = f"first answer token after {c.first_token_seconds:.2f} s"
    prefix = f"{c.prefix_tokens}-token document prefix"
    if c.path is None:
        return (
            f"{prefix} prefilled in this run in {c.prefix_prefill_seconds:.2f} s, once for every question (KV "
            f"{human_bytes(c.kv_bytes)}, scoring: {c.scoring}) · {first}"
        )
    return (
        f"loaded {c.path} · {human_bytes(c.file_bytes or 0)} on disk, KV {human_bytes(c.kv_bytes)} · {prefix} "
        f"prefilled in {c.prefix_prefill_seconds:.2f} s when compressed, read now in {c.read_seconds:.2f} s: "
        f"{c.prefill_saved_seconds:.2f} s saved · {first}"
    )


def turn_line(turn: int, r: RunResult) -> Text:
    """One chat turn's numbers (stderr)."""
    first = f" · first token {r.cache.first_token_seconds:.2f} s" if r.cache else ""
    return Text(
        f"turn {turn}: {r.generated_tokens} tokens{first} · decode {r.decode_tokens_per_second:.1f} tok/s · "
        f"KV {human_bytes(r.kv_bytes_final)} (memory back to {human_bytes(r.cache.kv_bytes if r.cache else 0)} "
        "for the next turn)",
        style="dim",
    )


def _rows(scoring: str | None) -> str:
    """The attention rows a saved prefix's H_l and V_l sum over."""
    return "reconstruction rows" if scoring == "reconstruct" else "window rows"


def _bytes_text(r: CompressResult) -> str:
    """On disk, in memory once loaded, and the full cache's, with the KV bits."""
    rotated = "Hadamard-rotated " if r.kv_rotation else ""
    groups = f"key groups of {r.kv_group} tokens, {rotated}value groups of {r.kv_value_group} channels"
    bits = "16 bits (the model's dtype)" if r.kv_bits == 16 else f"{r.kv_bits} bits, {groups}"
    memory = "" if r.kv_bits == 16 else " while compressing (a loaded file keeps its global layers quantized)"
    return (
        f"on disk {human_bytes(r.file_bytes)} (keys and values {human_bytes(r.kv_bytes_file)} at {bits}) · "
        f"in memory {human_bytes(r.kv_bytes_kept)}{memory} · full cache {human_bytes(r.kv_bytes_full)} "
        f"(the file is {r.file_fraction:.1%} of it)"
    )


def render_compress(r: CompressResult, console: Console) -> None:
    """The report of `cake compress` (stderr): settings, KV memory, the file, a line when the file is large for
    its document (`CompressResult.size_hint`), the layer chart."""
    t = _grid()
    _row(t, "file", f"{r.path} · {human_bytes(r.file_bytes)} ({r.file_ratio:.3f}× the kept KV bytes)")
    _settings_rows(t, r, r.method)
    _row(t, "scoring", SCORING_TEXT.get(r.scoring, r.scoring))
    _row(t, "bytes", _bytes_text(r))
    if r.kv_bits_reason and r.kv_bits_reason != BITS_GIVEN:  # the bits the tool chose, and why
        _row(t, "kv bits", f"{r.kv_bits}: {r.kv_bits_reason}")
    _kv_row(t, r, None)
    _row(t, "time", _time_text(r))
    console.print(Panel(t, title="CAKE compress", title_align="left", border_style="cyan"))
    if r.size_hint:
        console.print(f"[yellow]size:[/] {escape(r.size_hint)}", soft_wrap=True)
    if r.budget is not None and r.evicted:  # a prefix kept whole has nothing per layer to show yet
        console.print(layer_table(r.layers, console.width, _rows(r.scoring)))
