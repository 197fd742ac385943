"""`aiayn explain --seed-example`: the seeds' hand-worked numbers, replayed by the real model code.

The seeds are the five tutorial posts aiayn grew from (000-004, as docs/worked_example.md
numbers them): "seed 003" is the fourth post, never a random seed.

§1 (seed 003): two-head self-attention on "Hello World" with the seed's own matrices, loaded
into `aiayn.nn.attention.MultiHeadAttention` (x @ W is `nn.Linear` with weight W^T, zero
biases), run under `tracing()` in float64 so every printed number comes from the module.
§2 (seeds 003, 004): `sinusoidal_positions` beside the seeds' wrong values.
§3 (seed 004): causal self-attention through the same module with `causal=True`.
See docs/worked_example.md; the labels below are the ones it uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from aiayn.nn.attention import MultiHeadAttention, attention
from aiayn.nn.embeddings import sinusoidal_positions
from aiayn.nn.tracing import tracing

F64 = torch.float64


def t(rows: list) -> Tensor:
    return torch.tensor(rows, dtype=F64)


E = t([[1, 3, 3, 5], [2.84, 3.99, 4, 6]])  # "Hello", "World": embedding + (the seed's) PE
WQ = (
    t([[0, 0, 0], [1, 1, 0], [0, 0, 1], [1, 0, 0]]),
    t([[1, 0, 1], [0, 1, 0], [1, 0, 0], [0, 1, 1]]),
)
WK = (
    t([[1, 0, 1], [0, 1, 0], [1, 0, 1], [0, 1, 0]]),
    t([[0, 1, 1], [1, 0, 1], [1, 1, 0], [0, 1, 0]]),
)
WV = (
    t([[0, 1, 1], [1, 0, 0], [1, 0, 1], [0, 1, 0]]),
    t([[1, 0, 0], [0, 1, 1], [0, 0, 1], [1, 0, 0]]),
)
W_O = t(
    [
        [0.79445237, 0.1081456, 0.27411536, 0.78394531],
        [0.29081936, -0.36187258, -0.32312791, -0.48530339],
        [-0.36702934, -0.76471963, -0.88058366, -1.73713022],
        [-0.02305587, -0.64315981, -0.68306653, -1.25393866],
        [0.29077448, -0.04121674, 0.01509932, 0.13149906],
        [0.57451867, -0.08895355, 0.02190485, 0.24535932],
    ]
)
X = t([[0.5, 0.1, 0.3], [0.7, 0.2, 0.9], [0.6, 0.4, 0.8], [0.8, 0.3, 0.5]])  # seed 004
W_K = t([[0.5, 0.1, 0.3], [0.2, 0.7, 0.1], [0.3, 0.1, 0.6]])
# What seed 004 printed (miscomputed from K on; it calls its softmax values "assumed").
SEED004_K = [[0.32, 0.11, 0.36], [0.56, 0.2, 0.63], [0.47, 0.19, 0.54], [0.55, 0.18, 0.59]]
SEED004_SOFTMAX = [
    [1, 0, 0, 0],
    [0.445, 0.555, 0, 0],
    [0.34, 0.378, 0.282, 0],
    [0.25, 0.298, 0.236, 0.216],
]
SEED004_OUTPUT = [
    [0.5, 0.1, 0.3],
    [0.61, 0.16, 0.675],
    [0.6022, 0.2344, 0.6944],
    [0.622, 0.268, 0.656],
]


def num(x: float) -> str:
    """Up to 8 decimals without trailing zeros; tiny nonzero values in scientific notation."""
    if x == float("-inf"):
        return "-inf"
    if x != 0 and abs(x) < 1e-4:
        return f"{x:.8e}"
    s = f"{x:.8f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


@dataclass(frozen=True)
class Matrix:
    """One labelled vector or matrix of the replay: printed as `label = [...]` (text) or sent
    whole (JSON, the page), with the decimals it is printed to."""

    label: str
    rows: list  # a list of numbers, or a list of rows
    fmt: Callable[[float], str] = num
    decimals: int = 8  # what `fmt` prints at most

    def __str__(self) -> str:
        """`label = [[a, b], [c, d]]`, one matrix row per line, aligned under the first."""
        fmt, rows = self.fmt, self.rows
        if rows and not isinstance(rows[0], list):
            return f"{self.label} = [{', '.join(fmt(v) for v in rows)}]"
        pad = " " * (len(self.label) + 4)
        body = f",\n{pad}".join("[" + ", ".join(fmt(v) for v in r) + "]" for r in rows)
        return f"{self.label} = [{body}]"


Item = str | Matrix  # a line of prose, or a matrix


def mat(
    label: str, value: Tensor | list, fmt: Callable[[float], str] = num, decimals: int = 8
) -> Matrix:
    rows = value.tolist() if isinstance(value, Tensor) else value
    return Matrix(label, rows, fmt, decimals)


def _seed_mha(
    d_model: int, n_heads: int, wq: Tensor, wk: Tensor, wv: Tensor, wo: Tensor
) -> MultiHeadAttention:
    """A float64 MultiHeadAttention whose x @ W projections are the given (D_in, D) matrices."""
    mha = MultiHeadAttention(d_model, n_heads).double().eval()
    mha.trace_name = "attn"
    with torch.no_grad():
        mha.in_proj.weight.copy_(torch.cat([wq.T, wk.T, wv.T]))  # nn.Linear computes x W^T
        mha.in_proj.bias.zero_()
        mha.out_proj.weight.copy_(wo.T)
        mha.out_proj.bias.zero_()
    return mha


def _pad(w: Tensor, rows: int) -> Tensor:
    return torch.cat([w, torch.zeros(rows - w.size(0), w.size(1), dtype=F64)])


def section1() -> list[Item]:
    """Seed 003's "Hello World", two heads of d_k = 3, through MultiHeadAttention."""
    # The seed's heads are 3-dimensional while d_model is 4 (h * d_k = 6, not d_model as in the
    # paper), so the module is built with d_model = 6 and the 4-dim rows get two zero columns;
    # W^O (6x4) gets two zero output columns. No printed number depends on the padding.
    D = 6
    wq, wk, wv = (_pad(torch.cat(w, dim=1), D) for w in (WQ, WK, WV))
    wo = torch.cat([W_O, torch.zeros(D, 2, dtype=F64)], dim=1)
    mha = _seed_mha(D, 2, wq, wk, wv, wo)
    x = _pad(E.T, D).T[None]  # (1, 2, 6)
    out: list[Item] = [
        '== §1  Two-head self-attention on "Hello World" (seed 003), through '
        "aiayn.nn.model.MultiHeadAttention in float64 ==",
        "",
        mat("E", E),
    ]
    for h in (0, 1):
        out += [mat(f"WK{h + 1}", WK[h]), mat(f"WV{h + 1}", WV[h]), mat(f"WQ{h + 1}", WQ[h])]
    with torch.no_grad(), tracing() as rec:
        mha(x, x)
    r = {k.removeprefix("attn."): v[0] for k, v in rec.tensors.items()}
    out += ["", "with the paper's scale 1/sqrt(d_k) = 1/sqrt(3) (MultiHeadAttention.forward):"]
    for h in (0, 1):
        n = h + 1
        out += [
            mat(f"K{n}", r["k"][h]),
            mat(f"V{n}", r["v"][h]),
            mat(f"Q{n}", r["q"][h]),
            mat(f"Q{n} @ K{n}.T", r["scores"][h]),
            mat(f"Q{n} @ K{n}.T / sqrt(3)", r["scores_scaled"][h]),
            mat(f"head {n}, scale sqrt(3), weights", r["weights"][h]),
            mat(f"head {n}, scale sqrt(3)", r["heads"][h]),
        ]
    out.append(
        "(the softmax saturates: one weight is ~1, the other ~0, so both rows equal V's last row)"
    )
    # The seed's own fix, "/ 30": the explicit attention function with scale = 1/30 on the
    # module's own projections, then the module's W^O.
    with torch.no_grad():
        q, k, v = mha.project_qkv(x)
        heads, weights = attention(q, k, v, None, scale=1 / 30)
        concat = heads.transpose(1, 2).reshape(1, 2, D)
        z = mha.out_proj(concat)[0, :, :4]
    out += ["", "with the seed's scale 1/30 (aiayn.nn.attention.attention(q, k, v, scale=1/30)):"]
    for h in (0, 1):
        out += [
            mat(f"head {h + 1}, scale 30, weights", weights[0, h]),
            mat(f"head {h + 1}, scale 30", heads[0, h]),
        ]
    out += [
        mat("concat(head 1, head 2)", concat[0]),
        "",
        "Output projection W^O (6x4):",
        mat("W", W_O),
        mat("Z", z),
    ]
    out += _residual_norm(z)
    return out


def _residual_norm(z: Tensor) -> list[Item]:
    x = z + E
    mean, std = x.mean(-1), x.std(-1, unbiased=False)
    seed_ln = (x - mean[:, None]) / (std[:, None] + 1e-6)
    torch_ln = nn.LayerNorm(4, eps=1e-5, elementwise_affine=False).double()(x)
    return [
        "",
        "Residual + layer norm (gamma=1, beta=0):",
        mat("Z+E", x),
        mat("mean(Z+E)", mean),
        mat("std(Z+E)", std),
        "the seed's layer norm: (x - mean) / (std + 1e-6), population std:",
        mat("LN(Z+E)", seed_ln),
        "torch.nn.LayerNorm, the model's form (Ba et al.): (x - mean) / sqrt(var + 1e-5):",
        mat("nn.LayerNorm(Z+E)", torch_ln),
    ]


def section2() -> list[Item]:
    """The paper's sinusoids beside the seeds' values, which give cos the next pair's frequency."""
    pe = sinusoidal_positions(3, 4).double()  # the model's float32 table: 6 decimals hold
    seeds = {1: ("seed 003", [0.84, 0.99, 0, 1]), 2: ("seed 004", [0.9093, 0.9998, 0.02, 0.9999])}
    out: list[Item] = [
        "== §2  Sinusoidal positional encoding (seeds 003 and 004): the seeds are wrong ==",
        "PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (§3.5):",
        "both dimensions of a sin/cos pair share one frequency.",
        "aiayn.nn.model.sinusoidal_positions (computed in float64, stored as the model's float32):",
        "",
    ]
    out += [mat(f"d=4, pos={p}", pe[p], lambda v: f"{v:.6f}", 6) for p in range(3)]
    out += ["", "  pos  dim  aiayn (paper)  seed      formula"]
    for p, (who, vals) in seeds.items():
        for i in range(4):
            pair = 2 * (i // 2)
            fn = "sin" if i % 2 == 0 else "cos"
            wrong = abs(vals[i] - float(pe[p, i])) > 0.5 * 10 ** -_decimals(vals[i])
            flag = (
                f"  <- {who} is wrong here (a cos with another pair's frequency)" if wrong else ""
            )
            out.append(
                f"  {p:>3}  {i:>3}  {float(pe[p, i]):>12.6f}   {vals[i]:<8}  "
                f"{fn}({p} / 10000^({pair}/4)){flag}"
            )
    out += [
        "",
        mat("seed 003 pos=1 (wrong)", seeds[1][1]),
        mat("seed 004 pos=2 (wrong)", seeds[2][1]),
        "Seed 004's code also writes 10000 ^ (i / d_model): in Python ^ is XOR, not a power.",
    ]
    return out


def _decimals(v: float) -> int:
    s = repr(float(v))
    return len(s.split(".")[1]) if "." in s and not s.endswith(".0") else 0


def section3() -> list[Item]:
    """Seed 004's masked self-attention, one head of d_k = 3, through MultiHeadAttention."""
    eye = torch.eye(3, dtype=F64)
    mha = _seed_mha(3, 1, eye, W_K, eye, eye)  # W_Q = W_V = I; no W^O in the seed: I
    with torch.no_grad(), tracing() as rec:
        mha(X[None], X[None], causal=True)
    r = {k.removeprefix("attn."): v[0] for k, v in rec.tensors.items()}
    return [
        "== §3  Causal (masked) self-attention (seed 004), through "
        "MultiHeadAttention(causal=True) ==",
        "",
        mat("X", X),
        "W_Q = W_V = I (3x3)",
        mat("W_K", W_K),
        "d_k = 3",
        "mask M: 0 on and below the diagonal, -inf above it (a query sees itself and the past)",
        "",
        mat("K = X @ W_K", r["k"][0]),
        mat("QK^T", r["scores"][0]),
        f"1/sqrt(d_k) = 1/sqrt(3) = {1 / math.sqrt(3):.8f}",
        mat("QK^T/sqrt(3)", r["scores_scaled"][0]),
        mat("QK^T/sqrt(3) + M", r["scores_masked"][0]),
        mat("softmax(QK^T/sqrt(3) + M)", r["weights"][0]),
        mat("output", r["output"]),
        "",
        "What seed 004 printed instead (its K is miscomputed, and everything after it):",
        mat("seed 004 K", SEED004_K),
        mat("seed 004 softmax (assumed)", SEED004_SOFTMAX),
        mat("seed 004 output", SEED004_OUTPUT),
    ]


def seed_example_text() -> str:
    """The whole replay as text (what `aiayn explain --seed-example` prints)."""
    lines = [
        "aiayn explain --seed-example: the seeds' worked numbers, recomputed by aiayn's own "
        "MultiHeadAttention / attention / sinusoidal_positions (see docs/worked_example.md)",
        "",
    ]
    for part in (section1(), section2(), section3()):
        lines += [*map(str, part), ""]
    return "\n".join(lines)


def _jsonable(x: object) -> object:
    """-inf (masked scores) becomes null: strict JSON has no infinities."""
    if isinstance(x, list):
        return [_jsonable(v) for v in x]
    return None if x == float("-inf") else x


def seed_example_json() -> dict:
    """The same replay as data (`aiayn explain --seed-example --format json`, and what the
    page of `aiayn serve` shows): per section its title and items, each a line of prose
    (`{"text"}`) or a matrix (`{"label", "data", "decimals"}`: float64 numbers as computed,
    printed to `decimals` places in the text)."""
    sections = []
    for part in (section1(), section2(), section3()):
        title = str(part[0]).strip("= ")
        items: list[dict] = []
        for item in part[1:]:
            if isinstance(item, Matrix):
                items.append(
                    {"label": item.label, "data": _jsonable(item.rows), "decimals": item.decimals}
                )
            elif item:
                items.append({"text": item})
        sections.append({"title": title, "items": items})
    return {"format": "aiayn.seed_example/1", "doc": "docs/worked_example.md", "sections": sections}
