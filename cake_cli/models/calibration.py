"""How much each input channel of a model's linear layers matters, measured on a calibration text
(the weights of `quantize.quantize_int4`'s fit).

The importance of input channel k of a linear layer is the mean of x_k^2 over the calibration
tokens: the output error of a weight error e_k is sum_k e_k x_k, so its expected square weighs
e_k^2 by E[x_k^2] (llama.cpp's "importance matrix" uses the same statistic). The text is CPython's
`pydoc_data/topics.py` (the language reference's topics: English prose with code), shipped with
every Python, so the same text calibrates on every machine and no file is downloaded; it is not
one of the texts the quality numbers are measured on (LICENSE.txt, argparse.py, the benchmark suites).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from torch import nn

CALIBRATION_TOKENS = 1024  # tokens of the calibration text run through the model (one forward)
CALIBRATION_SKIP = 20_000  # characters skipped first: the file opens with a license header and code


def calibration_text() -> tuple[str, str] | None:
    """(name, text) of the calibration text, or None when this Python lacks it (then the fit is
    unweighted)."""
    path = Path(sysconfig.get_paths()["stdlib"], "pydoc_data", "topics.py")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return "cpython-pydoc-topics", text[CALIBRATION_SKIP:]


def input_importance(
    model: nn.Module, tokenizer, text: str, tokens: int = CALIBRATION_TOKENS
) -> dict[str, torch.Tensor]:
    """Mean squared input activation per input channel of every ``nn.Linear`` of `model`.

    Args:
        model: a float model (before quantization), in eval mode.
        tokenizer: its tokenizer.
        text: the calibration text; its first `tokens` tokens run through the model in one forward.

    Returns:
        {module name: [in_features] float32 >= 0} for each linear layer the forward reached.

    Raises:
        ValueError: the text gives no tokens, or ids beyond the model's vocabulary (a tokenizer
            that is not the model's).
    """
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :tokens]
    if ids.numel() == 0:
        raise ValueError("the calibration text gives no tokens")
    vocab = model.get_input_embeddings().num_embeddings
    if int(ids.max()) >= vocab:
        raise ValueError(f"the tokenizer gives id {int(ids.max())}, beyond the model's {vocab}-token vocabulary")
    device = next(model.parameters()).device
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(name):
        def record(_module, inputs, _output):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).float()  # [tokens, K]
            sums[name] = sums.get(name, 0) + (x * x).sum(dim=0).cpu()
            counts[name] = counts.get(name, 0) + x.shape[0]

        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    try:
        with torch.inference_mode():
            model(ids.to(device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return {name: total / counts[name] for name, total in sums.items()}
