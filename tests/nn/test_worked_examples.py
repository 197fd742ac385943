"""Every number of docs/worked_example.md §1-§3, reproduced by the model's own functions.

Where the seeds are right we match them to the printed precision; where they are wrong (§2, §3)
we assert the paper's value and record the seed's value as different.
"""

import torch

from aiayn.nn.attention import MultiHeadAttention, attention, causal_mask
from aiayn.nn.embeddings import sinusoidal_positions

D64 = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=D64)


# §1: two-head self-attention on "Hello World" (seed 003) -------------------------------------

E = t([[1, 3, 3, 5], [2.84, 3.99, 4, 6]])
WK1 = t([[1, 0, 1], [0, 1, 0], [1, 0, 1], [0, 1, 0]])
WV1 = t([[0, 1, 1], [1, 0, 0], [1, 0, 1], [0, 1, 0]])
WQ1 = t([[0, 0, 0], [1, 1, 0], [0, 0, 1], [1, 0, 0]])
WK2 = t([[0, 1, 1], [1, 0, 1], [1, 1, 0], [0, 1, 0]])
WV2 = t([[1, 0, 0], [0, 1, 1], [0, 0, 1], [1, 0, 0]])
WQ2 = t([[1, 0, 1], [0, 1, 0], [1, 0, 0], [0, 1, 1]])
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


def close(got, expected, decimals):
    torch.testing.assert_close(got, t(expected), rtol=0, atol=0.5 * 10**-decimals)


def test_section1_projections_and_scores():
    close(E @ WK1, [[4, 8, 4], [6.84, 9.99, 6.84]], 2)
    close(E @ WV1, [[6, 6, 4], [7.99, 8.84, 6.84]], 2)
    close(E @ WQ1, [[8, 3, 3], [9.99, 3.99, 4]], 2)
    close((E @ WQ1) @ (E @ WK1).T, [[68, 105.21], [87.88, 135.5517]], 4)


def test_section1_heads_with_sqrt_dk_saturate():
    h1, w1 = attention(E @ WQ1, E @ WK1, E @ WV1)  # scale defaults to 1/sqrt(3)
    close(h1, [[7.99, 8.84, 6.84], [7.99, 8.84, 6.84]], 2)
    torch.testing.assert_close(w1[0, 0], torch.tensor(4.68e-10, dtype=D64), rtol=5e-3, atol=0)
    h2, _ = attention(E @ WQ2, E @ WK2, E @ WV2)
    close(h2, [[8.84, 3.99, 7.99], [8.84, 3.99, 7.99]], 2)


def test_section1_heads_with_the_seeds_scale_of_one_thirtieth():
    h1, _ = attention(E @ WQ1, E @ WK1, E @ WV1, scale=1 / 30)
    h2, _ = attention(E @ WQ2, E @ WK2, E @ WV2, scale=1 / 30)
    close(h1, [[7.54348784, 8.20276657, 6.20276657], [7.65266185, 8.35857269, 6.35857269]], 8)
    close(h2, [[8.45589591, 3.85610456, 7.72085664], [8.63740591, 3.91937741, 7.84804146]], 8)
    Z = torch.cat([h1, h2], dim=1) @ W_O
    close(
        Z,
        [
            [11.46394285, -13.18016471, -11.59340253, -17.04387829],
            [11.62608573, -13.47454936, -11.87126395, -17.4926367],
        ],
        7,
    )
    # residual + the seed's layer norm: divide by (population std + 1e-6), gamma 1, beta 0
    x = Z + E
    mean, std = x.mean(-1), x.std(-1, unbiased=False)
    close(mean, [-4.58837567, -3.59559107], 8)
    close(std, [9.92061529, 10.50653019], 8)
    ln = (x - mean[:, None]) / (std[:, None] + 1e-6)
    close(
        ln,
        [
            [1.71887693, -0.56365339, -0.40370747, -0.75151608],
            [1.71909039, -0.56050453, -0.40695381, -0.75163205],
        ],
        8,
    )


def test_section1_through_the_real_multi_head_attention_module():
    """The same example through MultiHeadAttention with the seed's matrices loaded as weights:
    x @ W is nn.Linear with weight W^T. d_k = 3 per head, so W^Q is (4, 2*3) = [WQ1 | WQ2]."""
    mha = MultiHeadAttention(d_model=6, n_heads=2).double().eval()
    E6 = torch.cat([E, torch.zeros(2, 2, dtype=D64)], dim=1)  # pad the 4-dim input to d_model=6

    def pad(w):
        return torch.cat([w, torch.zeros(2, w.size(1), dtype=D64)], dim=0)

    with torch.no_grad():
        wq, wk, wv = (pad(torch.cat(p, dim=1)) for p in ((WQ1, WQ2), (WK1, WK2), (WV1, WV2)))
        mha.in_proj.weight.copy_(torch.cat([wq.T, wk.T, wv.T]))
        mha.in_proj.bias.zero_()
        mha.out_proj.weight.copy_(torch.eye(6, dtype=D64))  # W^O = I: output is concat(heads)
        mha.out_proj.bias.zero_()
    out = mha(E6[None], E6[None])
    close(out[0], [[7.99, 8.84, 6.84, 8.84, 3.99, 7.99]] * 2, 2)


# §2: sinusoidal positions; the seeds give the cos dimension the next pair's frequency -------


def test_section2_positional_encoding_follows_the_paper():
    pe = sinusoidal_positions(3, 4).double()
    close(pe[0], [0, 1, 0, 1], 6)
    close(pe[1], [0.84147098, 0.54030231, 0.00999983, 0.99995000], 6)
    close(pe[2], [0.90929743, -0.41614684, 0.01999867, 0.99980001], 6)


def test_section2_seed_values_are_wrong_and_we_say_so():
    pe = sinusoidal_positions(3, 4).double()
    seed003_pos1 = t([0.84, 0.99, 0, 1])
    seed004_pos2 = t([0.9093, 0.9998, 0.02, 0.9999])
    assert not torch.allclose(pe[1], seed003_pos1, atol=0.01)  # dim 1 is cos(1) = 0.54, not 0.99
    assert not torch.allclose(pe[2], seed004_pos2, atol=0.01)  # dim 1 is cos(2) = -0.42
    # Their error, reproduced: the odd dimension uses the next pair's frequency 10000^(2/4).
    assert abs(torch.cos(torch.tensor(1 / 100.0)) - seed003_pos1[1]) < 0.01


# §3: causal self-attention (seed 004) ------------------------------------------------------------


def test_section3_causal_self_attention():
    X = t([[0.5, 0.1, 0.3], [0.7, 0.2, 0.9], [0.6, 0.4, 0.8], [0.8, 0.3, 0.5]])
    W_K = t([[0.5, 0.1, 0.3], [0.2, 0.7, 0.1], [0.3, 0.1, 0.6]])
    K = X @ W_K
    close(K, [[0.36, 0.15, 0.34], [0.66, 0.30, 0.77], [0.62, 0.42, 0.70], [0.61, 0.34, 0.57]], 2)
    out, weights = attention(X, K, X, keep_mask=causal_mask(4, 4))
    close(
        weights,
        [
            [1, 0, 0, 0],
            [0.41047584, 0.58952416, 0, 0],
            [0.26480836, 0.37099143, 0.36420021, 0],
            [0.20469894, 0.27320309, 0.26835684, 0.25374114],
        ],
        8,
    )
    close(
        out,
        [
            [0.5, 0.1, 0.3],
            [0.61790483, 0.15895242, 0.65371449],
            [0.61061831, 0.24635921, 0.70469496],
            [0.65759864, 0.25857559, 0.64884850],
        ],
        8,
    )
