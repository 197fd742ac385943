"""The dot-product movie recommender of seeds 000 and 002: the intuition behind attention.

Seed 002: give every movie a feature vector (romance, action, comedy) and every user a
preference vector over the same features; their dot product says how well they match. Seed 000:
don't write these vectors by hand; make them parameters and learn them so that the dot products
match the ratings we know. Nobody tells the model what a feature means, yet the learned vectors
recover the hidden structure. Attention's Q K^T is the same dot-product matching (§3.2.1).

This script generates users and movies with 3 hidden features, a ratings matrix
R = U* M*^T + noise, and shows 30% of it to the model. It learns user and movie embeddings by
gradient descent (Adam) on the squared error of the observed ratings, then measures:
- held-out RMSE against predicting the mean rating;
- subspace alignment: the cosines of the principal angles between the learned movie factors
  and the true ones (1 = the same 3-D subspace). Learned factors are only defined up to an
  invertible linear map (any A with U A^-1 and M A^T gives the same dot products), so this
  is the right question, not whether factor 1 equals "romance";
- per hidden feature, the R^2 of predicting it linearly from the learned factors.

Run:  python examples/dot_product_recommender.py --plot recommender.png      (a few seconds)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from torch import Tensor, nn

FEATURES = ["romance", "action", "comedy"]


@dataclass
class Ratings:
    users_UK: Tensor  # true preferences (hidden)
    movies_MK: Tensor  # true features (hidden)
    ratings_UM: Tensor  # U* M*^T + noise
    observed_UM: Tensor  # bool: the ratings the model may see


def generate(n_users: int, n_movies: int, k: int, observed: float, noise: float, seed: int
             ) -> Ratings:  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    movies_MK = torch.rand(n_movies, k, generator=g)  # how romantic / action / comic, in [0, 1]
    users_UK = torch.randn(n_users, k, generator=g)  # likes (+) or dislikes (-) each feature
    ratings_UM = users_UK @ movies_MK.T + noise * torch.randn(n_users, n_movies, generator=g)
    observed_UM = torch.rand(n_users, n_movies, generator=g) < observed
    return Ratings(users_UK, movies_MK, ratings_UM, observed_UM)


class DotProductModel(nn.Module):
    """rating(u, m) = <user_u, movie_m>: the matching score of seed 002, with learned vectors."""

    def __init__(self, n_users: int, n_movies: int, k: int) -> None:
        super().__init__()
        self.users = nn.Embedding(n_users, k)
        self.movies = nn.Embedding(n_movies, k)
        for e in (self.users, self.movies):
            nn.init.normal_(e.weight, std=0.3)

    def forward(self) -> Tensor:
        return self.users.weight @ self.movies.weight.T  # (U, M): every pair at once


def principal_cosines(a_NK: Tensor, b_NK: Tensor) -> Tensor:
    """Cosines of the principal angles between the column spaces of a and b (1 = aligned)."""
    qa, _ = torch.linalg.qr(a_NK)
    qb, _ = torch.linalg.qr(b_NK)
    return torch.linalg.svdvals(qa.T @ qb)


def r_squared(learned_NK: Tensor, true_NK: Tensor) -> Tensor:
    """Per true feature, R^2 of its best linear prediction (with intercept) from the learned."""
    x = torch.cat([learned_NK, torch.ones(len(learned_NK), 1, dtype=learned_NK.dtype)], 1)
    coef = torch.linalg.lstsq(x, true_NK).solution
    resid = true_NK - x @ coef
    return 1 - resid.pow(2).sum(0) / (true_NK - true_NK.mean(0)).pow(2).sum(0)


def run(
    n_users: int = 200,
    n_movies: int = 150,
    k: int = 3,
    observed: float = 0.3,
    noise: float = 0.1,
    steps: int = 200,
    lr: float = 0.1,
    seed: int = 0,
) -> dict[str, object]:
    """Generate, train, measure. Returns every figure the report prints."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 200 x 150 matrices: extra threads only wait on each other
    try:
        return _run(n_users, n_movies, k, observed, noise, steps, lr, seed)
    finally:
        torch.set_num_threads(threads)


def _run(n_users: int, n_movies: int, k: int, observed: float, noise: float, steps: int,
         lr: float, seed: int) -> dict[str, object]:  # fmt: skip
    torch.manual_seed(seed)
    data = generate(n_users, n_movies, k, observed, noise, seed)
    model = DotProductModel(n_users, n_movies, k)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    seen, target = data.observed_UM, data.ratings_UM
    losses = []
    for _ in range(steps):
        loss = (model()[seen] - target[seen]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        pred_UM = model()
        held_out = ~seen
        rmse = float((pred_UM[held_out] - target[held_out]).pow(2).mean().sqrt())
        mean = target[seen].mean()
        baseline = float((mean - target[held_out]).pow(2).mean().sqrt())
        corr = float(torch.corrcoef(torch.stack([pred_UM[held_out], target[held_out]]))[0, 1])
        learned_MK = model.movies.weight.detach().double()
        cosines = principal_cosines(learned_MK, data.movies_MK.double())
        r2 = r_squared(learned_MK, data.movies_MK.double())
    return {
        "data": data, "model": model, "losses": losses, "pred": pred_UM,
        "rmse": rmse, "baseline_rmse": baseline, "noise": noise, "corr": corr,
        "cosines": cosines.tolist(), "r2": r2.tolist(), "learned_movies": learned_MK,
    }  # fmt: skip


def report(r: dict) -> str:
    data: Ratings = r["data"]
    n_seen, n_all = int(data.observed_UM.sum()), data.observed_UM.numel()
    lines = [
        f"{len(data.users_UK)} users x {len(data.movies_MK)} movies, "
        f"{len(FEATURES)} hidden features ({', '.join(FEATURES)}); "
        f"{n_seen} of {n_all} ratings observed",
        f"training loss (MSE on observed ratings): {r['losses'][0]:.3f} -> {r['losses'][-1]:.4f}",
        f"held-out RMSE: {r['rmse']:.3f}   (predicting the mean: {r['baseline_rmse']:.3f}; "
        f"noise floor {r['noise']:.3f})",
        f"held-out correlation of predicted and true ratings: {r['corr']:.3f}",
        "subspace alignment, cosines of the principal angles between learned and true movie "
        "features: " + ", ".join(f"{c:.4f}" for c in r["cosines"]) + "  (1 = same subspace)",
        "R^2 of each hidden feature from the learned factors (linear map): "
        + ", ".join(f"{f} {v:.3f}" for f, v in zip(FEATURES, r["r2"], strict=True)),
        "The model saw only ratings, never the features: the dot products alone recovered them.",
    ]
    return "\n".join(lines)


def plot(r: dict, path: str) -> None:
    """Loss curve, held-out predictions, and each hidden feature against its learned estimate."""
    from matplotlib.figure import Figure

    data: Ratings = r["data"]
    fig = Figure(figsize=(16, 4), layout="constrained")
    axes = fig.subplots(1, 2 + len(FEATURES))
    axes[0].plot(r["losses"])
    axes[0].set(yscale="log", xlabel="Adam step", ylabel="MSE on observed", title="training")
    held = ~data.observed_UM
    axes[1].scatter(data.ratings_UM[held][:3000], r["pred"][held][:3000], s=2, alpha=0.3)
    axes[1].set(xlabel="true rating", ylabel="predicted", title=f"held out, r = {r['corr']:.3f}")
    learned = r["learned_movies"]
    x = torch.cat([learned, torch.ones(len(learned), 1, dtype=learned.dtype)], 1)
    mapped = x @ torch.linalg.lstsq(x, data.movies_MK.double()).solution
    for i, name in enumerate(FEATURES):
        ax = axes[2 + i]
        ax.scatter(data.movies_MK[:, i], mapped[:, i], s=6, alpha=0.6)
        ax.plot([0, 1], [0, 1], color="grey", lw=1)
        ax.set(xlabel=f"true {name}", ylabel="from learned factors",
               title=f"{name}: R² = {r['r2'][i]:.3f}")  # fmt: skip
    fig.suptitle("dot-product recommender: learned movie factors recover the hidden features")
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plot", help="write the figure to this PNG")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    r = run(steps=args.steps, seed=args.seed)
    print(report(r))
    if args.plot:
        plot(r, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
