"""Matrix products for inference on a CPU: `Linear`, an `nn.Linear` with a decoding fast path.

The model (`aiayn.nn`) calls `Linear` as it would `nn.Linear`; everything below is how the
product runs on this machine, not what it computes. The same parameters, the same state dict,
the same results to ~1e-6 relative, and a row's bits never depend on the batch it shares.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Decoding multiplies small batches (one row per sentence or beam) by fixed weights. oneDNN can
# prepack a weight once into its blocked layout; for those shapes that is 2-2.5x faster than
# the plain GEMM on AVX-512 CPUs, with the same fp32 arithmetic (results agree to ~1e-6
# relative). Training and anything that needs gradients take the ordinary path.
#
# Whatever the path, a row's result must not depend on how many rows share the call (a served
# sentence is batched with whatever else is in flight, and must get the bits `aiayn translate`
# gets). The prepacked product keeps that at every row count. On an AVX2-only CPU a prepacked
# call costs a fixed ~50-90 us more than MKL's `F.linear`, which
# is faster for weights under ~2^20 elements (1-7x at 1-32 rows); MKL gives a row other bits
# in calls of 1, 2-3 and 4 or more rows, but the same bits at every count from 4 up. So there
# small weights take `F.linear` with a call's rows padded to at least `PLAIN_MIN_ROWS`, once
# `plain_rows_invariant` has seen that hold for the weight's shape and the thread count on
# this machine (one thread: yes; two: no) (docs/lab/decoding.md, "Small weights
# through `F.linear` on AVX2").
_ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and hasattr(
    torch.ops.mkldnn, "_linear_pointwise"
)
PLAIN_MAX_WEIGHTS = 1 << 20  # elements: smaller weights may take `F.linear` on AVX2-only CPUs
PLAIN_MIN_ROWS = 4  # rows a plain call is padded to


def plain_rows_invariant(in_features: int, out_features: int) -> bool:
    """Whether `F.linear` gives every row the same bits at any row count >= PLAIN_MIN_ROWS and
    at any place in the call, for a weight of this shape on this machine's BLAS with the
    current number of torch threads: checked on random rows against one call of 260, at 8
    counts and offsets (a few ms, once per shape and thread count). With 2 threads MKL splits a
    call's rows between them, a thread may get fewer than 4, and the check fails (as on an
    AVX2-only CPU)."""
    return _rows_invariant(in_features, out_features, torch.get_num_threads())


@functools.cache
def _rows_invariant(in_features: int, out_features: int, threads: int) -> bool:
    """`plain_rows_invariant`, run with `threads` (the current count: the cache's key)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g)
    x = torch.randn(260, in_features, generator=g)
    every = F.linear(x, w, b)
    spans = [(0, 4), (1, 5), (3, 7), (2, 8), (5, 13), (7, 33), (11, 64), (60, 200)]
    return all(torch.equal(F.linear(x[a : a + n], w, b), every[a : a + n]) for a, n in spans)


def _plain_preferred() -> bool:
    """AVX2-only CPUs (no AVX-512, no AMX): where prepacking loses for small weights."""
    return torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2")


_PLAIN_PREFERRED = _plain_preferred()


def padded_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`F.linear` with the call's rows padded to PLAIN_MIN_ROWS (zeros, results dropped)."""
    rows = x.numel() // x.size(-1)
    if rows >= PLAIN_MIN_ROWS:
        return F.linear(x, weight, bias)
    x_RD = x.reshape(rows, x.size(-1))
    padded_PD = torch.cat([x_RD, x_RD.new_zeros(PLAIN_MIN_ROWS - rows, x.size(-1))])
    return F.linear(padded_PD, weight, bias)[:rows].reshape(*x.shape[:-1], weight.size(0))


# The activations a Linear applies: ReLU is the paper's FFN (§3.3), swish (SiLU,
# x * sigmoid(x)) is what Marian's OPUS-MT models use, GELU BERT's (exact, with erf) and GPT-2's
# (its tanh approximation, "gelu_tanh").
Activation = Literal["none", "relu", "swish", "gelu", "gelu_tanh"]
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "none": lambda x: x,
    "relu": F.relu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
}
# The same, fused into the prepacked oneDNN product: its (attribute, algorithm) arguments.
ONEDNN_ACTIVATIONS: dict[str, tuple[str, str]] = {
    "none": ("none", ""),
    "relu": ("relu", ""),
    "swish": ("swish", ""),
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
}
# Those torch computes with the same bits wherever an element sits in a call, so the plain
# path may apply them after `padded_linear`. Torch's SiLU and tanh-GELU compute a call's last
# few elements (its length mod the vector width) by a scalar path with other bits (tanh-GELU:
# 70 of 142 three-row slices of a (1000, 257) tensor differed from the whole call's rows), so
# a row's bits would depend on where the call ends: they stay fused in oneDNN, exact anywhere.
EXACT_ANYWHERE = ("none", "relu")


def _pointwise(x: Tensor, packed: Tensor, bias: Tensor | None, activation: str) -> Tensor:
    """The prepacked oneDNN product with `activation` fused into it."""
    attr, algorithm = ONEDNN_ACTIVATIONS[activation]
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, attr, [], algorithm)


class _Plan(NamedTuple):
    """The path an inference call of a `Linear` took, kept for the calls after it."""

    stamp: tuple[int, int, int]  # `Linear._stamp` when it was made
    packed: bool  # the prepacked oneDNN product (else `padded_linear`)
    weight: Tensor  # the weight's rows (a view), or their packed copy
    bias: Tensor | None  # the bias's (a view)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) with two extras for inference:

    - `rows=(start, end)` uses only those output rows, e.g. W^Q out of [W^Q; W^K; W^V];
    - when no gradient is being recorded on a CPU fp32 tensor, the product runs on a oneDNN
      prepacked copy of the weight, rebuilt whenever the weight changes (its version counter
      or storage moves), so optimizer steps and `load_state_dict` are always seen. The packed
      copies live beside the weights (the model's size again, once decoding has run). On an
      AVX2-only CPU a small weight instead takes `F.linear` padded to 4 rows, where that is
      faster and gives a row the same bits in any batch (module comment above).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias)
        self._packed: dict[tuple[int, int], tuple[tuple[int, int, int], Tensor]] = {}
        # (rows, activation, torch threads) -> the path an inference call took and what it
        # needs (`_Plan`), so that later calls skip the checks that chose it: they cost ~20% of
        # a one-row decoding step of the quick start model (docs/lab/overhead.md, "A linear
        # layer's checks made once").
        self._plans: dict[tuple[tuple[int, int] | None, str, int], _Plan] = {}

    def forward(
        self, x: Tensor, rows: tuple[int, int] | None = None, *, activation: Activation = "none"
    ) -> Tensor:
        if not torch.is_grad_enabled() and x.is_cpu and x.dtype is torch.float32:
            plan = self._plans.get((rows, activation, torch.get_num_threads()))
            if plan is not None and plan.stamp == self._stamp(plan.packed):
                if plan.packed:
                    return _pointwise(x, plan.weight, plan.bias, activation)
                return ACTIVATIONS[activation](padded_linear(x, plan.weight, plan.bias))
        start, end = rows if rows is not None else (0, self.out_features)
        weight = self.weight if rows is None else self.weight[start:end]
        bias = None if self.bias is None else self.bias[start:end]
        if (
            _ONEDNN_LINEAR
            and not torch.is_grad_enabled()
            and x.device.type == "cpu"
            and x.dtype == torch.float32 == weight.dtype
            and not weight.is_inference()  # no version counter: changes could not be seen
        ):
            # Swish and GELU stay fused in oneDNN (EXACT_ANYWHERE above); ReLU is exact anywhere.
            key = (rows, activation, torch.get_num_threads())
            kept_bias = None if bias is None else bias.detach()
            if activation in EXACT_ANYWHERE and self._plain(start, end):
                self._plans[key] = _Plan(self._stamp(False), False, weight.detach(), kept_bias)
                return ACTIVATIONS[activation](padded_linear(x, weight, bias))
            packed = self._packed_weight(start, end, weight)
            self._plans[key] = _Plan(self._stamp(True), True, packed, kept_bias)
            return _pointwise(x, packed, bias, activation)
        return ACTIVATIONS[activation](F.linear(x, weight, bias))

    def _stamp(self, packed: bool) -> tuple[int, int, int]:
        """What a plan's tensors depend on: the weight's and the bias's storage (new storage
        from `.to()` or `.data =` makes a plan stale; views see in-place updates, optimizer
        steps and `load_state_dict` alike) and, for a packed copy of the weight, its version."""
        w, b = self.weight, self.bias
        return (w.data_ptr(), 0 if b is None else b.data_ptr(), w._version if packed else -1)

    def _plain(self, start: int, end: int) -> bool:
        """Whether rows start:end of the weight take `padded_linear` (module comment above): a
        rule of the machine and the shape, never of timings, so every process on a machine
        computes the same bits."""
        rows = end - start
        return (
            _PLAIN_PREFERRED
            and rows * self.in_features < PLAIN_MAX_WEIGHTS
            and plain_rows_invariant(self.in_features, rows)
        )

    def _packed_weight(self, start: int, end: int, weight: Tensor) -> Tensor:
        stamp = self._stamp(True)
        cached = self._packed.get((start, end))
        if cached is None or cached[0] != stamp:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 32)
            cached = (stamp, packed)
            self._packed[(start, end)] = cached
        return cached[1]
