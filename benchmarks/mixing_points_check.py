"""The overlap mixture at d = 100, K = 16 (identity covariances): the mixing rule at 1024, 4096 and 16384 points and 16 randomised 4096-point rules. python benchmarks/mixing_points_check.py"""
import sys, numpy as np, jax
jax.config.update("jax_enable_x64", True)
sys.path.insert(0, "tests"); sys.path.insert(0, "src")
import reference as R
from numpyro_gmm import mixing_qmc_entropy
for d, K in ((100, 16),):
    lg, locs, tril = R.hard_mixture("overlap", d, K)
    sc = np.ones((K, d))
    out = {M: float(mixing_qmc_entropy(lg, locs, scale=sc, num_points=M)) for M in (1024, 4096, 16384)}
    keys = jax.random.split(jax.random.PRNGKey(0), 16)
    r = np.array([float(mixing_qmc_entropy(lg, locs, scale=sc, num_points=4096, key=k)) for k in keys])
    print(d, K, {M: round(v, 4) for M, v in out.items()}, "randomised 4096 x16 mean %.4f sd %.4f" % (r.mean(), r.std()), flush=True)
