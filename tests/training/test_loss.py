"""loss.py: the label-smoothed loss (§5.4) against PyTorch's cross-entropy, value and
gradient, in chunks and in bf16, PAD ignored."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.config import PAD_ID
from aiayn.training.loss import label_smoothed_loss


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), eps=st.sampled_from([0.0, 0.1, 0.3]), n=st.integers(1, 40))
def test_loss_equals_torch_cross_entropy(seed, eps, n):
    """Value and gradient: the written-out backward against autograd through PyTorch's."""
    g = torch.Generator().manual_seed(seed)
    logits_NV = (torch.randn(n, 11, generator=g) * 3).requires_grad_()
    ref_logits_NV = logits_NV.detach().clone().requires_grad_()
    target_N = torch.randint(0, 11, (n,), generator=g)  # includes PAD_ID = 0 sometimes
    loss, nll = label_smoothed_loss(logits_NV, target_N, eps, PAD_ID)
    ref = F.cross_entropy(
        ref_logits_NV, target_N, label_smoothing=eps, ignore_index=PAD_ID, reduction="sum"
    )
    ref_nll = F.cross_entropy(ref_logits_NV, target_N, ignore_index=PAD_ID, reduction="sum")
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
    (2.5 * loss).backward()  # an upstream gradient other than 1 reaches every row
    (2.5 * ref).backward()
    torch.testing.assert_close(logits_NV.grad, ref_logits_NV.grad, rtol=1e-5, atol=1e-6)
    assert not nll.requires_grad  # a reading for the log, not a second objective


def test_loss_gradient_comes_back_in_the_logits_dtype():
    """Under bf16 autocast the logits are bf16: the loss is computed in fp32 and its gradient
    is handed back as bf16, as autograd's cast would."""
    logits = torch.randn(5, 9).to(torch.bfloat16).requires_grad_()
    loss, _ = label_smoothed_loss(logits, torch.tensor([1, 2, PAD_ID, 4, 5]), 0.1, PAD_ID)
    assert loss.dtype == torch.float32
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loss_in_chunks_gives_every_row_the_bits_of_one_pass(monkeypatch, dtype):
    """The loss goes through the logits a few rows at a time on a CPU (`CHUNK_BYTES`): value,
    NLL and gradient are bit for bit those of one pass over the whole matrix, whatever the
    chunk and however the rows split (23 rows in chunks of 1, 3 and 7, and all at once)."""
    import aiayn.training.loss as loss_module

    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(23, 11, generator=g) * 3).to(dtype)
    target = torch.randint(0, 11, (23,), generator=g)

    def run(chunk_rows: int) -> tuple[torch.Tensor, ...]:
        monkeypatch.setattr(loss_module, "CHUNK_BYTES", 4 * 11 * chunk_rows)
        x = logits.clone().requires_grad_()
        loss, nll = label_smoothed_loss(x, target, 0.1, PAD_ID)
        (1.7 * loss).backward()
        return loss, nll, x.grad

    whole = run(23)
    for rows in (1, 3, 7):
        for a, b in zip(run(rows), whole, strict=True):
            assert torch.equal(a, b), rows


def test_loss_ignores_pad_completely():
    logits = torch.randn(4, 7, requires_grad=True)
    loss, _ = label_smoothed_loss(logits, torch.tensor([3, PAD_ID, 5, PAD_ID]), 0.1, PAD_ID)
    loss.backward()
    assert logits.grad[1].abs().sum() == 0 and logits.grad[3].abs().sum() == 0
