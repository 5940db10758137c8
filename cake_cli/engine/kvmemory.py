"""Keys and values held quantized in memory while answering (KIVI, Liu et al. 2024, arXiv 2402.02750,
Sec. 3.2-3.3 and Algorithm 1; docs/method.md §Quantized KV).

A `QuantLayer` is a global layer's cache whose older slots are held as the .cake file's parts
(`kvquant.quantize_entry`: keys per channel, values per token, grouped affine, 8, 4 or 2 bits, 4-bit and
2-bit codes packed two and four to a byte, float16 scales and zeros; from format 6 the values Hadamard-rotated
before quantizing, the rotation undone as they are dequantized), so loading a file is a copy. Its
newest slots, the *residual*, stay in the model's dtype, as KIVI keeps its R most recent tokens in full
precision: the prefix's last `recent` tokens (the observation window: what every question attends to
first) and every token added since (the question, the answer). A format-5 file's first `sink` tokens (the
attention sinks) stay in the model's dtype too. Slots 0 .. s-1 are the sink, s .. s+m-1 quantized,
s+m .. s+m+r-1 the residual; the positions [H_kv, s + m + r] cover all three, and slots stay in position
order.

**Attention.** `update` returns the layer's whole keys and values [1, H_kv, s + m + r, d] in the model's dtype,
the quantized slots dequantized for this one call, a block at a time (a transient of one layer, dropped
once it has attended; `CakeCache.track_peak` counts it). So every attention backend (eager, SDPA, the CPU
single-query path; flash_attention_2 gets the same tensors, not run in the tests: no GPU), mask and
decode policy runs unchanged, and the keys and values it sees equal those of the same quantized cache
dequantized to full tensors once (`kvquant.dequantize_entry`: the same float32 arithmetic, bit for bit).

**Where we differ from KIVI.** (1) Tokens added after loading are not quantized in groups of R as the
residual fills (KIVI's streaming step): an answer is short next to the document, so they stay in full
precision. (2) A question's CAKE eviction of a prefix kept whole (and any eviction of several tokens at
once) removes slots physically (`keep`): a value row leaves with its scale and zero; a key
keeps its per-channel group's scale and zero, so each slot remembers its group (`group_of` [H_kv, m]
int32, made at the first eviction from the quantized slots; a group's scale and zero stay until no KV head
holds one of its slots). When the KV heads of a layer drop different numbers of quantized slots, the extra
quantized slots of the heads that kept more move to the residual as their dequantized values (exact: the
values a dequantized cache holds), at most H_kv - 1 slots per step. Sink slots that every head keeps in
equal numbers stay the sink; when the heads keep different numbers of them (a head evicted one), the layer's
kept slots all move to the residual, dequantized: exact and in position order, at the memory of a
dequantized layer (measured in `nbytes`). (3) The `fixed` decode policy's one eviction a step removes
nothing: as in a full-precision layer, the next token takes the released slot, its row laid over the slot
(`written`, `_write_rows`), so a decode step copies no quantized part and the keys and values attention sees
are the reference's (the same cache dequantized once, decoded as a full-precision layer) in the same slot
order. A later `keep` holds the layer dequantized (exact; no decode step calls one).

**Not quantized in memory** (held in the model's dtype, as a loaded file was before): local
(sliding-window) layers, which hold at most window - 1 tokens, and layers whose KV heads hold different
numbers of tokens (`--allocation global`, `engine.headlengths`).
"""

from __future__ import annotations

import torch

from cake_cli.engine.cache import CakeLayer
from cake_cli.engine.kvquant import dequantize_keys, dequantize_values

KINDS = ("keys", "values")


def quantizable(layer: CakeLayer) -> bool:
    """Whether `layer` may be held quantized in memory (module docstring: a global, non-ragged layer with tokens)."""
    return layer.window is None and layer.start is None and layer.keys is not None and layer.live() > 0


class QuantLayer(CakeLayer):
    """A global layer held as quantized slots + a full-precision residual (module docstring).

    Attributes:
        bits: 8, 4 or 2. group: G, entries per key group (tokens). width: d, the head dimension.
        value_group: channels per value group (format 6: 64; before, G). rotated: the values were quantized
            Hadamard-rotated (format 6, `kvquant` "Rotated values"): dequantizing undoes it.
        sink: the first s slots [1, H_kv, s, d] keys and values in the model's dtype (format 5), or None.
        parts: {"keys": {...}, "values": {...}} each {"codes": [H_kv, m, ceil(d · bits / 8)] uint8, "scale"
            and "zero" float16 (keys [H_kv, groups, d], values [H_kv, m, ceil(d / G)])}, `kvquant`'s layout.
        group_of: [H_kv, m] int32 the key group of each quantized slot, or None (slot i is in group i // G).
        keys, values: the residual [1, H_kv, r, d] in the model's dtype (`CakeLayer`'s tensors).
    """

    def __init__(self, bits: int, group: int, *, value_group: int | None = None, rotated: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.bits, self.group, self.width = bits, group, 0
        self.value_group, self.rotated = value_group or group, rotated
        self.parts: dict[str, dict[str, torch.Tensor]] = {}
        self.group_of: torch.Tensor | None = None
        self.sink: tuple[torch.Tensor, torch.Tensor] | None = None  # [1, H_kv, s, d] keys, values (format 5)
        self.written: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # decode's rows (`_write_rows`)

    @classmethod
    def from_parts(
        cls,
        parts: dict[str, dict[str, torch.Tensor]],
        positions,
        seen: int,
        bits: int,
        group: int,
        *,
        value_group: int | None = None,
        rotated: bool = False,
    ):
        """A layer from one layer's file parts (`kvquant.quantize_entry` of keys and values, already checked).

        Args:
            parts: {"keys": entry, "values": entry}, each with "codes", "scale", "zero", "recent" [H_kv, r, d]
                and optionally "sink" [H_kv, s, d] (format 5).
            positions: [H_kv, s + m + r] int64 true positions, increasing. seen: the next token's position.
            value_group, rotated: as the attributes (the file's `kv_value_group`, `kv_rotation`).
        """
        layer = cls(bits, group, value_group=value_group, rotated=rotated)
        residual = [parts[kind]["recent"].unsqueeze(0) for kind in KINDS]  # [1, H_kv, r, d]
        layer.lazy_initialization(*residual)
        layer.keys, layer.values = residual
        layer.parts = {kind: {p: parts[kind][p] for p in ("codes", "scale", "zero")} for kind in KINDS}
        if "sink" in parts["keys"] and parts["keys"]["sink"].shape[1]:
            layer.sink = tuple(parts[kind]["sink"].unsqueeze(0) for kind in KINDS)  # [1, H_kv, s, d]
        layer.width = residual[0].shape[-1]
        layer.positions, layer.seen = positions, seen
        return layer

    def copy(self) -> QuantLayer:
        """An independent copy (`continuation.clone_cache`): parts, residual, positions, scores."""
        out = QuantLayer(self.bits, self.group, value_group=self.value_group, rotated=self.rotated)
        out.lazy_initialization(self.keys, self.values)
        out.keys, out.values = self.keys.clone(), self.values.clone()
        out.parts = {kind: {p: t.clone() for p, t in entry.items()} for kind, entry in self.parts.items()}
        out.width, out.positions, out.seen = self.width, self.positions.clone(), self.seen
        out.group_of = None if self.group_of is None else self.group_of.clone()
        out.sink = None if self.sink is None else tuple(t.clone() for t in self.sink)
        out.written = None if self.written is None else tuple(t.clone() for t in self.written)
        out.accumulates, out.scores = self.accumulates, None if self.scores is None else self.scores.clone()
        return out

    def quantized(self) -> int:
        """m, the quantized slots per KV head."""
        return self.parts["keys"]["codes"].shape[1] if self.parts else 0

    def sunk(self) -> int:
        """s, the exact sink slots per KV head (before the quantized ones)."""
        return 0 if self.sink is None else self.sink[0].shape[2]

    def dequantized_into(self, out: torch.Tensor) -> None:
        """Write the quantized slots' keys and values into `out` [2, H_kv, m, d] (model dtype; keys then values),
        `BLOCK` tokens at a time (`dequantize_keys`, `dequantize_values`)."""
        keys, values = self.parts["keys"], self.parts["values"]
        dequantize_keys(out[0], keys, self.bits, self.group, self.group_of)
        dequantize_values(out[1], values, self.bits, self.value_group, rotated=self.rotated)

    def whole(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every slot's keys and values [1, H_kv, s + m + r, d], model dtype (new tensors: sink, quantized, then
        residual)."""
        heads, r, d = self.keys.shape[1], self.keys.shape[2], self.width
        s, m = self.sunk(), self.quantized()
        out = self.keys.new_empty(2, heads, s + m + r, d)  # [2, H_kv, s + m + r, d]: one allocation, no concatenation
        if self.sink is not None:
            out[0, :, :s].copy_(self.sink[0][0])
            out[1, :, :s].copy_(self.sink[1][0])
        self.dequantized_into(out[:, :, s : s + m])
        out[0, :, s + m :].copy_(self.keys[0])
        out[1, :, s + m :].copy_(self.values[0])
        if self.written is not None:  # decode's tokens over the slots they took (duplicate slots hold equal rows)
            slots, keys, values = self.written
            index = slots.unsqueeze(-1).expand(-1, -1, d)  # [H_kv, p, d]
            out[0].scatter_(1, index, keys[0])
            out[1].scatter_(1, index, values[0])
        return out[0:1], out[1:2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append q new tokens to the residual (`CakeLayer.update`); return the whole layer [1, H_kv, s + m + r, d]
        in the model's dtype, for this attention call only."""
        super().update(key_states, value_states)
        return self.whole()

    def _write_rows(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """A decode token [1, H_kv, 1, d] into the released slot free[h] of each head h (`CakeLayer.release`): a
        quantized slot cannot take a full-precision row, so the row goes to `written` (slots [H_kv, p] int64, keys
        and values [1, H_kv, p, d] in the model's dtype), which `whole` lays over the slots. Every row a head
        already wrote to that slot is overwritten; when some head had none there, a column is added (the other
        heads' entries in it repeat their slot and row, so duplicates always hold equal rows). No slot moves, so
        the layer keeps the slot order and the positions tensor of a full-precision layer (`FixedDecode`
        trusts it from step to step) and a step copies no quantized part; `written` grows by at most one row a
        head per decoded token."""
        free = self.free.unsqueeze(1)  # [H_kv, 1]
        if self.written is None:
            self.written = (free.clone(), key_states.clone(), value_states.clone())
            return
        slots, keys, values = self.written
        hit = slots == free  # [H_kv, p]
        over = hit.unsqueeze(0).unsqueeze(-1)  # [1, H_kv, p, 1]
        keys, values = torch.where(over, key_states, keys), torch.where(over, value_states, values)
        if not bool(hit.any(dim=1).all()):
            slots = torch.cat([slots, free], dim=1)
            keys, values = torch.cat([keys, key_states], dim=2), torch.cat([values, value_states], dim=2)
        self.written = (slots, keys, values)

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the slots `index` [H_kv, k] (int64, ascending per head) of each KV head (module docstring).

        Sink slots kept by every head in equal numbers stay the sink; the first m' = min over heads of the kept
        quantized slots stay quantized; each head's other kept slots form the new residual, a head's extra
        quantized ones dequantized (exact). When the heads keep different numbers of sink slots, every kept slot
        joins the residual, dequantized (exact, slots in position order, at the memory of a dequantized layer)."""
        index = index.to(self.keys.device)
        s = self.sunk()
        sunk = (index < s).sum(dim=1)  # [H_kv] kept sink slots per head
        kept_sink = int(sunk.min()) if index.shape[1] else 0
        # slots a decode wrote, or heads keeping unequal sink slots: held dequantized from here on (exact)
        if self.written is not None or (s and not bool((sunk == kept_sink).all())):
            self._hold_dequantized()
            s = kept_sink = 0
        if s:
            head = index[:, :kept_sink].unsqueeze(0).unsqueeze(-1).expand(1, -1, -1, self.width)  # [1, H_kv, s', d]
            self.sink = tuple(t.gather(2, head) for t in self.sink) if kept_sink else None
        self._keep_after_sink(index[:, kept_sink:] - s, kept_sink)
        self.positions = self.positions.gather(1, index)  # [H_kv, k]
        if self.scores is not None:
            self.scores = self.scores.gather(1, index)

    def _hold_dequantized(self) -> None:
        """Every slot into the residual, dequantized (`whole`: sink, quantized slots, residual, decode's written rows,
        in slot order); the quantized parts, sink and written rows dropped."""
        self.keys, self.values = self.whole()  # [1, H_kv, s + m + r, d]
        self.parts = {kind: {p: t[:, :0] for p, t in entry.items()} for kind, entry in self.parts.items()}
        self.sink, self.group_of, self.written = None, None, None

    def _keep_after_sink(self, index: torch.Tensor, sink: int) -> None:
        """Keep the quantized and residual slots `index` [H_kv, k'] (ascending, counted after the sink), the sink's
        `sink` slots kept already; positions and scores are the caller's."""
        m = self.quantized()
        counts = (index < m).sum(dim=1)  # [H_kv] kept quantized slots per head (they come first: ascending)
        kept = int(counts.min()) if index.shape[1] else 0
        rest = index[:, kept:]  # [H_kv, k' - m'] slots that form the new residual
        if bool((counts == kept).all()):
            expanded = (rest - m).unsqueeze(0).unsqueeze(-1).expand(1, *rest.shape, self.width)
            self.keys, self.values = self.keys.gather(2, expanded), self.values.gather(2, expanded)
        else:
            keys, values = self.whole()  # [1, H_kv, s + m + r, d], s = `sink` (already cut)
            expanded = (rest + sink).unsqueeze(0).unsqueeze(-1).expand(1, *rest.shape, self.width)
            self.keys, self.values = keys.gather(2, expanded), values.gather(2, expanded)
        if kept < m:
            self._keep_quantized(index[:, :kept])

    def _keep_quantized(self, index: torch.Tensor) -> None:
        """Keep the quantized slots `index` [H_kv, m'] (ascending): codes and value scales/zeros gathered by
        row; key scales/zeros stay while some head keeps a slot of their group (dropped, and `group_of`
        renumbered, once none does), `group_of` remembers each kept slot's group."""
        heads, m = self.parts["keys"]["codes"].shape[:2]
        if self.group_of is None:
            self.group_of = (torch.arange(m, device=index.device) // self.group).to(torch.int32).expand(heads, m)
        self.group_of = self.group_of.gather(1, index).contiguous()
        used = torch.zeros(self.parts["keys"]["scale"].shape[1], dtype=torch.bool, device=index.device)
        used[self.group_of.flatten().long()] = True  # [groups] some head still holds a slot of the group
        if not bool(used.all()):
            self.group_of = (used.cumsum(0) - 1)[self.group_of.long()].to(torch.int32)  # the kept groups' new ids
            kept = used.nonzero().squeeze(1)
            for name in ("scale", "zero"):
                self.parts["keys"][name] = self.parts["keys"][name].index_select(1, kept)  # [H_kv, groups', d]
        rows = ["codes"], ["codes", "scale", "zero"]
        for kind, names in zip(KINDS, rows):
            for name in names:
                t = self.parts[kind][name]  # [H_kv, m, c]
                self.parts[kind][name] = t.gather(1, index.unsqueeze(-1).expand(-1, -1, t.shape[-1]))

    def live(self) -> int:
        """Tokens held per KV head: sink + quantized + residual, less a released slot."""
        held = self.sunk() + self.quantized() + (self.keys.shape[-2] if self.keys is not None else 0)
        return held - (1 if self.free is not None else 0)

    def nbytes(self) -> int:
        """Bytes held by the quantized parts (codes, scales, zeros, `group_of`), the sink, the residual and the rows
        a decode wrote (`written`), measured."""
        held = [t for entry in self.parts.values() for t in entry.values()] + [self.keys, self.values]
        held += [] if self.group_of is None else [self.group_of]
        held += [] if self.sink is None else list(self.sink)
        held += [] if self.written is None else list(self.written)
        return sum(t.numel() * t.element_size() for t in held)
