"""Parameter-free self-attention on a toy sentence (seed 000, "Transformers from scratch").

    y_i = sum_j w_ij x_j,   w_ij = softmax_j(x_i . x_j)      i.e.  Y = softmax(X X^T) X

Every output vector is a weighted average of the input vectors, weighted by how much they
"agree" (dot product). There are no parameters: what it does depends only on the embeddings.
This script prints the weights for "the cat walks on the street" with small hand-made
embeddings, then shows the two properties the seed points out:
- permutation equivariance: shuffle the words and the outputs are shuffled the same way;
- order is invisible: both "the"s get exactly the same output, wherever they stand.
That is why the Transformer adds positional encodings (§3.5).

Run:  python examples/self_attention_toy.py            (about a second)
"""

from __future__ import annotations

import argparse

import torch

from aiayn.nn.attention import self_attention_unparameterised

WORDS = ["the", "cat", "walks", "on", "the", "street"]
# Hand-made 4-dim embeddings: [thing, action, place, function word]. In a real model these are
# learned; here they are chosen so that the dot products are easy to read.
EMBED = {
    "the": [0.0, 0.0, 0.0, 1.0],
    "cat": [1.5, 0.3, 0.0, 0.0],
    "walks": [0.5, 1.5, 0.2, 0.0],
    "on": [0.0, 0.2, 0.5, 0.8],
    "street": [0.6, 0.0, 1.5, 0.0],
}


def table(title: str, m: torch.Tensor, rows: list[str], cols: list[str]) -> str:
    width = max(7, *(len(c) for c in cols)) + 1
    lines = [title, " " * 8 + "".join(c.rjust(width) for c in cols)]
    for r, row in zip(rows, m.tolist(), strict=True):
        lines.append(r.ljust(8) + "".join(f"{v:{width}.3f}" for v in row))
    return "\n".join(lines)


def run(words: list[str] = WORDS, seed: int = 0) -> dict[str, object]:
    """Weights, outputs and the two checks; returns the numbers the test reads."""
    x_TD = torch.tensor([EMBED[w] for w in words], dtype=torch.float64)
    y_TD = self_attention_unparameterised(x_TD[None])[0]  # the library's own function
    weights_TT = torch.softmax(x_TD @ x_TD.T, dim=-1)  # the same weights, shown explicitly
    torch.testing.assert_close(y_TD, weights_TT @ x_TD)  # Y = softmax(X X^T) X, nothing else

    perm = torch.randperm(len(words), generator=torch.Generator().manual_seed(seed))
    y_perm_TD = self_attention_unparameterised(x_TD[perm][None])[0]
    equivariance_error = float((y_perm_TD - y_TD[perm]).abs().max())
    the = [i for i, w in enumerate(words) if w == "the"]
    same_output_error = float((y_TD[the[0]] - y_TD[the[-1]]).abs().max()) if len(the) > 1 else 0.0
    return {
        "words": words,
        "x": x_TD,
        "weights": weights_TT,
        "y": y_TD,
        "perm": perm.tolist(),
        "equivariance_error": equivariance_error,
        "same_output_error": same_output_error,
    }


def report(r: dict) -> str:
    words, dims = r["words"], ["thing", "action", "place", "function"]
    perm_words = [words[i] for i in r["perm"]]
    return "\n\n".join([
        table("input X (one embedding per word):", r["x"], words, dims),
        table("raw weights X X^T (dot products):", r["x"] @ r["x"].T, words, words),
        table("weights softmax(X X^T), each row sums to 1:", r["weights"], words, words),
        table("output Y = weights @ X:", r["y"], words, dims),
        f"'cat' attends most to: {words[int(r['weights'][1].argmax())]!r}"
        f" (then {words[int(r['weights'][1].argsort(descending=True)[1])]!r})",
        "permutation equivariance: shuffle the sentence to " + " ".join(perm_words) + "\n"
        f"  max |attend(X[perm]) - attend(X)[perm]| = {r['equivariance_error']:.2e}",
        "order is invisible: the two 'the's (positions "
        f"{[i for i, w in enumerate(words) if w == 'the']}) get the same output,\n"
        f"  max difference = {r['same_output_error']:.2e}; positional encodings fix this (§3.5)",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0, help="seed of the random permutation")
    args = p.parse_args(argv)
    print(report(run(seed=args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
