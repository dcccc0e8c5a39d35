"""Crossing thin ellipses in 2-D (condition 1e4): Gauss-Hermite quadrature against Monte Carlo truth, and the mixing rule. python benchmarks/thin_truth_check.py"""
import sys, numpy as np, jax
jax.config.update("jax_enable_x64", True)
sys.path.insert(0, "tests"); sys.path.insert(0, "src")
import reference as R
from numpyro_gmm import mixing_qmc_entropy
lg, locs, tril = R.hard_mixture("thin", 2, 4)
w = np.exp(lg - np.logaddexp.reduce(lg))
print("GH200", R.entropy_gauss_hermite(w, locs, tril, n=200), flush=True)
print("MC 2^20", R.entropy_monte_carlo_chol(w, locs, tril, draws_per_component=2**20, seed=1), flush=True)
for M in (1024, 16384):
    print("mixing", M, float(mixing_qmc_entropy(lg, locs, tril, num_points=M)), flush=True)
