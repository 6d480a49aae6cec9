"""How far float32 rounding alone may move each parameter of a run: the tolerance of the
equivalence tests, derived from the optimizer's own arithmetic (test helper).

A strategy computes the same gradient as single, summed in another order (chunks,
micro-batches, devices, ranks). A reordered float32 sum differs by a few units of roundoff
of its terms, so the gradient an optimizer step receives differs from single's by

    |e_t| <= E_t = RHO * G_t,    G_t = the global L2 norm of that gradient (after clipping),

element by element: RHO is the reordering's error relative to the gradient's norm (below).
The optimizer turns ``e`` into a parameter difference; the bound follows its update:

SGD, momentum mu (torch's, no dampening): the buffer b_t = mu b_(t-1) + g_t carries
    |db_t| <= mu |db_(t-1)| + E_t, and the parameter moves by lr_t b_t:
    |dp| <= sum_t lr_t |db_t|, the same for every element.

Adam/AdamW: p moves by lr_t u_t, u_t = m^_t / (sqrt(v^_t) + eps), where m^_t and sqrt(v^_t)
    are a weighted mean and a weighted RMS of the gradients with weights summing to 1, so each
    moves by at most E_t* = max_(s<=t) E_s. To first order
        |du_t| <= E_t* (1 + |u_t|) / (sqrt(v^_t) + eps),
    the amplification by a small denominator: an element whose gradient is nearly zero (v^
    small) turns a rounding error into a large change of its step. Beyond first order du_t
    is bounded by the step itself: |u_t| <= B_t (Cauchy-Schwarz on Adam's weights, see
    :func:`adam_step_bound`), so |du_t| <= 2 B_t. Then |dp| <= sum_t lr_t |du_t|.
    Decoupled weight decay multiplies a difference by (1 - lr wd) < 1: it never grows it.

Every term is read from the reference (single) run as it trains: its lr, its gradient's
norm, and Adam's m^ and v^ for every element, after each step. Left out: a parameter
difference feeding back into later gradients (second order over the few steps compared).

RHO. A sum of n float32 terms in two orders differs by at most about sqrt(n) u (random
rounding; (n-1) u in the worst case) times the terms' magnitude, u = 2**-24. Measured here
(LeNet, clipped AdamW, 2 chunks x 2 micro-batches against one batch of 32): the largest
|e| over every element and step was 0.8 u times the gradient's norm. RHO = 16 u keeps a
factor 20 above it, and stays orders of magnitude below what a real bug moves (a gradient
scaled wrongly, a clip norm taken over one device only: tests/unit/test_rounding.py).
"""

from __future__ import annotations

import math
import weakref

import torch

U32 = 2.0 ** -24  # float32's unit roundoff
RHO = 16 * U32  # a reordered gradient's error, relative to the gradient's global norm

_BOUNDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def adam_step_bound(beta1: float, beta2: float, t: int) -> float:
    """The largest |m^_t / sqrt(v^_t)| Adam can take at step t (1-based), whatever the
    gradients: m_t = sum a_k g_k and v_t = sum b_k g_k^2 with a_k = (1-beta1) beta1^k and
    b_k = (1-beta2) beta2^k, so |m_t| <= sqrt(sum a_k^2 / b_k) sqrt(v_t); then the bias
    corrections. 1 at t = 1 (the step is sign(g))."""
    s = sum((1 - beta1) ** 2 / (1 - beta2) * (beta1 * beta1 / beta2) ** k for k in range(t))
    return math.sqrt(s) * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)


class RoundingBound:
    """The per-element bound on |dp| for one model's parameters, grown step by step by a
    post-hook on its optimizer (``watch``)."""

    def __init__(self, named: dict[str, torch.Tensor]):
        self.names = {id(p): n for n, p in named.items()}
        self.bound = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in named.items()}
        self.e_max = 0.0  # E* so far
        self.sgd_carry: dict[str, float] = {}  # |db_(t-1)| per parameter (SGD)

    def watch(self, opt: torch.optim.Optimizer) -> None:
        opt.register_step_post_hook(lambda o, args, kwargs: self._stepped(o))

    def _stepped(self, opt: torch.optim.Optimizer) -> None:
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g.double()) for g in grads])).item()
        e = RHO * norm
        self.e_max = max(self.e_max, e)
        for group in opt.param_groups:
            lr = float(group["lr"])
            for p in group["params"]:
                name = self.names.get(id(p))
                if name is None or p.grad is None:
                    continue
                state = opt.state[p]
                if "exp_avg_sq" in state:  # Adam, AdamW
                    self.bound[name] += lr * self._adam_du(state, group)
                else:  # SGD
                    carry = group.get("momentum", 0.0) * self.sgd_carry.get(name, 0.0) + e
                    self.sgd_carry[name] = carry
                    self.bound[name] += lr * carry

    def _adam_du(self, state: dict, group: dict) -> torch.Tensor:
        beta1, beta2 = group["betas"]
        t = int(state["step"])
        m_hat = state["exp_avg"].double() / (1 - beta1 ** t)
        denom = (state["exp_avg_sq"].double() / (1 - beta2 ** t)).sqrt() + group["eps"]
        u = m_hat / denom
        first_order = self.e_max * (1 + u.abs()) / denom
        return first_order.clamp(max=2 * adam_step_bound(beta1, beta2, t))


def watch(strategy) -> None:
    """Grow a rounding bound for ``strategy``'s primary model while it trains (one optimizer:
    the reference runs are single's)."""
    named = dict(strategy.primary_model().named_parameters())
    bound = RoundingBound(named)
    for opt in strategy.optimizers():
        bound.watch(opt)
    _BOUNDS[strategy] = bound


def rounding_bound(reference) -> dict[str, torch.Tensor]:
    """{parameter name: per-element bound on |dp|} of a watched run (see the module)."""
    return _BOUNDS[reference].bound


def assert_equal_within_rounding(got: dict[str, torch.Tensor], reference) -> None:
    """Every parameter of ``got`` equals the reference run's within the bound float32
    rounding of a reordered gradient allows it (the module's derivation); the message names
    the worst element and how many times its bound it is off."""
    bound = rounding_bound(reference)
    ref = dict(reference.primary_model().named_parameters())
    assert got.keys() == ref.keys()
    for name, value in got.items():
        diff = (value.detach().double().cpu() - ref[name].detach().double().cpu()).abs()
        over = diff / bound[name].clamp(min=1e-30)
        worst = int(over.argmax())
        assert over.flatten()[worst] <= 1, (
            f"{name}: element {worst} differs by {diff.flatten()[worst].item():.3g}, "
            f"{over.flatten()[worst].item():.3g} times what float32 rounding allows "
            f"({bound[name].flatten()[worst].item():.3g})")


def ratio(got: dict[str, torch.Tensor], reference) -> float:
    """The largest difference of ``got`` from the reference in units of its bound (1 = at
    the bound)."""
    bound = rounding_bound(reference)
    ref = dict(reference.primary_model().named_parameters())
    return max(((got[n].detach().double().cpu() - ref[n].detach().double().cpu()).abs()
                / bound[n].clamp(min=1e-30)).max().item() for n in got)
