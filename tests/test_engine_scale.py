"""Scale properties of the power-integral engine: blocking, device unranking, sharding.

No timing or memory assertions here (those are in ``benchmarks/``): these tests check that
the mechanisms that bound memory and spread work over devices leave values and gradients
unchanged.
"""

import os
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import X64, ftype, run_fresh_python_json
from numpyro_gmm._kernels.power_integrals import _unrank_halves, log_moments
from numpyro_gmm.compositions import compositions_up_to, unrank_table


def mixture(rng, K, d):
    logits = rng.normal(size=K)
    locs = 2.0 * rng.normal(size=(K, d))
    tril = np.tril(rng.normal(size=(K, d, d)), -1) * 0.4 + np.diag(rng.uniform(0.5, 1.5, d))
    return [jnp.asarray(x, ftype()) for x in (jax.nn.log_softmax(logits), locs, tril)]


@pytest.mark.parametrize("n_max,K", [(0, 0), (4, 1), (5, 3), (6, 4), (3, 7)])
def test_unranking_matches_enumeration(n_max, K):
    # Reference: compositions_up_to, built by appending parts (independent of the ranking).
    expected = compositions_up_to(n_max, K)[0]
    np.testing.assert_array_equal(unrank_table(n_max, K), expected)
    k_b = max(K - 1, 0)
    table_a, table_b = _unrank_halves(n_max, K, k_b) if K else (None, None)
    if K:
        np.testing.assert_array_equal(np.asarray(table_a).T, expected)
        np.testing.assert_array_equal(np.asarray(table_b).T, compositions_up_to(n_max, k_b)[0])


@pytest.mark.parametrize("d,diagonal", [(1, False), (3, False), (2, True)])
def test_gradient_through_many_blocks_equals_one_block(rng, d, diagonal):
    """Block size 7 (dozens of scan steps, each adding to the Jacobian) against one block holding everything."""
    log_w, locs, tril = mixture(rng, 5, d)
    scale = jnp.exp(0.3 * jnp.asarray(rng.normal(size=(5, d)), ftype()))

    def f(block_size):
        def moments(lw, m, t):
            args = (lw, m, None, t) if diagonal else (lw, m, t)
            log_a, lm = log_moments(*args, k_max=4, block_size=block_size)
            return log_a + jnp.sum(jnp.exp(lm) * jnp.arange(1.0, 5.0, dtype=lm.dtype))

        # jitted: the same code, traced once (called eagerly, each operation compiles on its own)
        return jax.jit(jax.value_and_grad(moments, argnums=(0, 1, 2)))(log_w, locs, scale if diagonal else tril)

    many, one = f(7), f(100_000)
    tol = dict(rtol=1e-10, atol=1e-12) if X64 else dict(rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(many[0], one[0], **tol)
    for g_many, g_one in zip(many[1], one[1]):
        np.testing.assert_allclose(g_many, g_one, **tol)


SHARDED = textwrap.dedent(
    """
    import json, jax, jax.numpy as jnp, numpy as np
    from numpyro_gmm._kernels import power_integrals as pi
    assert len(jax.devices()) == 4, jax.devices()
    rng = np.random.default_rng(1)
    K, d = 6, 2
    lw = jax.nn.log_softmax(jnp.asarray(rng.normal(size=K)))
    locs = jnp.asarray(2.0 * rng.normal(size=(K, d)))
    tril = jnp.asarray(np.tril(rng.normal(size=(K, d, d)), -1) * 0.4 + np.eye(d))
    def f(lw, m, t):
        log_a, lm = pi.log_moments(lw, m, t, k_max=5, block_size=16)
        return log_a + jnp.sum(jnp.exp(lm) * jnp.arange(1.0, 6.0))
    vg = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))
    used = "shard_map" in str(jax.make_jaxpr(f)(lw, locs, tril))
    sharded = vg(lw, locs, tril)
    # jitted: the same code, traced (called eagerly, each operation compiles on its own)
    moments_sharded = jax.jit(lambda a, b, c: pi.log_moments(a, b, c, k_max=5, block_size=16)[1])(lw, locs, tril)
    pi._devices = lambda: jax.devices()[:1]  # the single-device path
    single = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(lw, locs, tril)
    moments_single = jax.jit(lambda a, b, c: pi.log_moments(a, b, c, k_max=5, block_size=16)[1])(lw, locs, tril)
    diffs = [float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(single))]
    diffs.append(float(jnp.max(jnp.abs(moments_sharded - moments_single))))
    print(json.dumps(dict(used=used, diffs=diffs, value=float(single[0]))))
    """
)


@pytest.mark.skipif(not X64, reason="the subprocess runs in float64 whatever the pass: it runs once, in the float64 pass")
def test_sharded_over_four_devices_equals_single_device():
    """Four host devices (XLA flag, float64) in a subprocess: value, gradient and moments to 1e-10.

    The subprocess keeps this process's other XLA flags (the suite's optimisation level) and
    its compilation cache settings."""
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    out = run_fresh_python_json(SHARDED, x64=True, xla_flags=flags.strip(), timeout=300, JAX_PLATFORMS="cpu")
    assert out["used"], "the 4-device run did not take the shard_map path"
    assert np.isfinite(out["value"])
    assert max(out["diffs"]) <= 1e-10, out["diffs"]


@pytest.mark.parametrize("d", [1, 2, 3, 4, 6])
def test_solve_rows_matches_numpy(rng, d):
    """Half means ``Lambda^-1 eta`` on rows (closed forms, unrolled Cholesky, LAPACK) against
    ``numpy.linalg.solve`` in float64 (independent)."""
    from numpyro_gmm._kernels.gaussian import solve_rows

    B = 37
    A = rng.normal(size=(B, d, d))
    lam = A @ np.swapaxes(A, -1, -2) + d * np.eye(d)
    eta = rng.normal(size=(B, d))
    iu, ju = np.triu_indices(d)
    got = jax.jit(solve_rows, static_argnums=2)(jnp.asarray(eta.T, ftype()), jnp.asarray(lam[:, iu, ju].T, ftype()), d)
    expected = np.linalg.solve(lam, eta[..., None])[..., 0].T
    tol = dict(rtol=1e-10, atol=1e-12) if X64 else dict(rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(got), expected, **tol)


@pytest.mark.parametrize("d", [2, 3, 6])
def test_row_solvers_give_nan_for_a_matrix_that_is_not_positive_definite(rng, d):
    """A symmetric matrix with a negative eigenvalue (built from a known spectrum) gives NaN in
    every row solver (closed form, unrolled Cholesky, LAPACK), and its neighbours stay finite."""
    from numpyro_gmm._kernels.gaussian import logdet_and_inverse_rows, logdet_and_quad_rows, solve_rows

    Q, _ = np.linalg.qr(rng.normal(size=(2, d, d)))
    spectrum = np.ones((2, d))
    spectrum[1, 0] = -0.5  # row 1 is indefinite
    lam = Q @ (spectrum[:, :, None] * np.swapaxes(Q, -1, -2))
    iu, ju = np.triu_indices(d)
    rows = jnp.asarray(lam[:, iu, ju].T, ftype())
    eta = jnp.asarray(rng.normal(size=(d, 2)), ftype())
    outputs = [jax.jit(solve_rows, static_argnums=2)(eta, rows, d),
               *jax.jit(logdet_and_quad_rows, static_argnums=(2, 3))(eta, rows, d, False)]
    log_det, inv = jax.jit(logdet_and_inverse_rows, static_argnums=1)(rows, d)
    outputs += [log_det, *inv]
    for out in outputs:
        out = np.asarray(out).reshape(-1, 2)
        assert np.all(np.isfinite(out[:, 0])) and np.any(np.isnan(out[:, 1])), out


@pytest.mark.parametrize("d", [1, 2, 3, 4, 6])
def test_logdet_and_inverse_rows_match_numpy(rng, d):
    """``ln|Lambda|`` and ``Lambda^-1`` on rows (closed forms, unrolled Cholesky, LAPACK), used
    by the engine's derivative, against ``numpy.linalg.slogdet`` and ``numpy.linalg.inv`` in
    float64 (independent); broadcast shapes."""
    from numpyro_gmm._kernels.gaussian import logdet_and_inverse_rows

    A = rng.normal(size=(3, 5, d, d))
    lam = A @ np.swapaxes(A, -1, -2) + d * np.eye(d)
    iu, ju = np.triu_indices(d)
    rows = [jnp.asarray(lam[..., i, j], ftype()) for i, j in zip(iu, ju)]
    log_det, inv = jax.jit(logdet_and_inverse_rows, static_argnums=1)(rows, d)
    got = np.stack([np.asarray(x) for x in inv], -1)
    expected = np.linalg.inv(lam)[..., iu, ju]
    tol = dict(rtol=1e-10, atol=1e-12) if X64 else dict(rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(got, expected, **tol)
    np.testing.assert_allclose(log_det, np.linalg.slogdet(lam)[1], **tol)


@pytest.mark.parametrize("d,diagonal", [(2, False), (3, True)])
def test_embedded_and_unranked_half_tables_agree(rng, monkeypatch, d, diagonal):
    """The two sources of the half tables (program constants for small problems, device
    unranking beyond ``EMBED_MAX_ENTRIES``) give the same moments and gradients."""
    from numpyro_gmm._kernels import power_integrals as pi

    log_w, locs, tril = mixture(rng, 7, d)
    factor = jnp.exp(0.3 * jnp.asarray(rng.normal(size=(7, d)), ftype())) if diagonal else tril

    def value_and_grad():
        def f(lw, m, t):  # a new function per call: jit's cache must not return the other path
            args = (lw, m, None, t) if diagonal else (lw, m, t)
            log_a, lm = pi.log_moments(*args, k_max=4, block_size=64)
            return log_a + jnp.sum(jnp.exp(lm) * jnp.arange(1.0, 5.0, dtype=lm.dtype))

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(log_w, locs, factor)

    embedded = value_and_grad()
    monkeypatch.setattr(pi, "EMBED_MAX_ENTRIES", 0)
    unranked = value_and_grad()
    tol = dict(rtol=1e-12, atol=1e-12) if X64 else dict(rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(embedded[0], unranked[0], **tol)
    for a, b in zip(embedded[1], unranked[1]):
        np.testing.assert_allclose(a, b, **tol)


def test_gradient_through_an_inner_jit_equals_plain_gradient(rng):
    """``grad`` of a function that calls the engine inside its own ``jit`` (as
    ``GaussianMixture.entropy`` does) traces the derivative rule outside that jit: it must not
    capture arrays made while the inner jit traced (reference: the same gradient without the
    inner jit)."""
    log_w, locs, tril = mixture(rng, 4, 2)

    def moments(lw, m, t):
        log_a, lm = log_moments(lw, m, t, k_max=3, block_size=16)
        return log_a + jnp.sum(jnp.exp(lm))

    inner = jax.jit(moments)
    got = jax.grad(lambda m: inner(log_w, m, tril))(locs)
    expected = jax.jit(jax.grad(lambda m: moments(log_w, m, tril)))(locs)  # one trace, no inner jit
    tol = dict(rtol=1e-10, atol=1e-12) if X64 else dict(rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(got, expected, **tol)
