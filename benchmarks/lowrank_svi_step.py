"""One SVI step of AutoGaussianMixture(K = 4, covariance="lowrank", rank = 4) + TraceEntropy_ELBO
at a given d (init_method="spread"), and its entropy's value and gradient alone (the randomised
rule with the ELBO's ``num_entropy_points``, or ``M`` given as the second argument): compile time,
XLA's planned temporaries and one run each. ``python benchmarks/lowrank_svi_step.py 10000 [M]``."""
import time, sys, numpy as np, jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
from numpyro.infer import SVI
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "src"))
from numpyro_gmm import AutoGaussianMixture, TraceEntropy_ELBO, GaussianMixture
d = int(sys.argv[1])
def model(y):
    z = numpyro.sample("z", dist.Normal(jnp.zeros(d), 1.0).to_event(1))
    numpyro.sample("y", dist.Normal(z, 1.0).to_event(1), obs=y)
y = jnp.asarray(np.random.default_rng(0).normal(size=d), jnp.float32)
g = AutoGaussianMixture(model, num_components=4, covariance="lowrank", rank=4, init_method="spread")
elbo = TraceEntropy_ELBO() if len(sys.argv) < 3 else TraceEntropy_ELBO(num_entropy_points=int(sys.argv[2]))
M = elbo.num_entropy_points
print("d", d, "entropy points per component", M)
svi = SVI(model, g, numpyro.optim.Adam(1e-3), elbo)
t = time.time(); state = svi.init(jax.random.PRNGKey(0), y); print("init", time.time() - t, flush=True)
p = svi.get_params(state); post = g.get_posterior(p)
fe = lambda lg, m, f, k: GaussianMixture(m, cov_factor=f[0], cov_diag=f[1], logits=lg).entropy(key=k, num_points=M)
args = (post.logits, post.loc, (post.cov_factor, post.cov_diag), jax.random.PRNGKey(1))
for name, fn, a in (("entropy vg key", jax.value_and_grad(fe, argnums=(0, 1, 2)), args), ("update", svi.update, (state, y))):
    t = time.time(); c = jax.jit(fn).lower(*a).compile(); m = c.memory_analysis()
    print(name, "compile %.1f s" % (time.time() - t), "temp MiB %.0f" % (m.temp_size_in_bytes / 2**20), flush=True)
    t = time.time(); jax.block_until_ready(c(*a)); print("  run %.2f s" % (time.time() - t), flush=True)
