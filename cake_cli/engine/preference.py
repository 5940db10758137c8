"""Layer preference score from dispersion and shift (paper Sec. 3 and 4.1, Eqs. 3-7)."""

from __future__ import annotations

import math

import torch


def dispersion(a_ev: torch.Tensor) -> float:
    """Spatial dispersion H_l = -sum_{h,i,j} A log A over the evictable columns (Eqs. 3-4).

    Args:
        a_ev: [H, w, n - w] float32 window attention over the evictable keys (not renormalised).

    Returns:
        H_l >= 0 as a Python float (0 log 0 = 0).
    """
    # -sum a·log(max(a, tiny)): 0·log(tiny) = 0 stands for 0 log 0; in float32, whose pairwise sum agrees
    # with a float64 reference to ~1e-7 relative (tests/engine/test_properties.py) at a quarter of the time
    # of torch.special.entr summed in float64, the layer's largest scoring cost on a long prompt
    logs = a_ev.clamp_min(torch.finfo(torch.float32).tiny).log_()  # [H, w, n - w]
    return -float(logs.mul_(a_ev).sum())


def shift(column_var: torch.Tensor) -> float:
    """Temporal shift V_l = sum_{h,j} Var_i A[h,i,j] (Eqs. 5-6).

    Args:
        column_var: [H, n - w] variance of each evictable column over the w window rows
            (`variance_rows(a_ev)`; computed once and shared with the indicator, Eq. 11).

    Returns:
        V_l >= 0 as a Python float (0 when w = 1).
    """
    return float(column_var.sum(dtype=torch.float64))


def log_preference(dispersion_h: float, shift_v: float, tau1: float, tau2: float) -> float:
    """log P_l with P_l = H_l^(1/tau1) · V_l^(1/tau2) (Eq. 7), computed in log space.

    Only ratios of P matter (Eq. 7 normalises), and the powers 1/tau can under- or overflow a
    float, so allocation works on log P. A zero H or V gives -inf (P = 0).

    Args:
        dispersion_h: H_l (nats).
        shift_v: V_l.
        tau1, tau2: temperatures (> 0).

    Returns:
        log P_l, possibly -inf.
    """
    if dispersion_h <= 0 or shift_v <= 0:
        return float("-inf")
    return math.log(dispersion_h) / tau1 + math.log(shift_v) / tau2
