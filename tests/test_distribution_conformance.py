"""``GaussianMixture`` against NumPyro's distribution contract: ``arg_constraints``,
``infer_shapes``, return annotations, pytree round trips and ``validate_args`` under
``jax.jit``.

References: NumPyro's own distributions in the same situation (``MixtureSameFamily`` of
``MultivariateNormal`` or ``Normal(...).to_event(1)`` built from the same raw arguments,
with NumPyro's ``Categorical``), NumPy's broadcasting rules for the expected shapes, and
``typing.get_type_hints`` for the annotations. (NumPyro's generic test file itself runs on
these cases in CI: tests/upstream/run_numpyro_suite.py.)
"""

from __future__ import annotations

from typing import get_type_hints

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from jax import Array, lax

from conftest import ftype
from numpyro_gmm import GaussianMixture

K, D = 2, 2
LOC = np.array([[-1.0, 0.5], [1.0, -0.5]])
COV = np.array([[[1.0, 0.3], [0.3, 0.8]], [[0.6, -0.2], [-0.2, 1.2]]])
TRIL = np.linalg.cholesky(COV)
SCALE = np.array([[0.8, 1.2], [1.0, 0.7]])
PROBS = np.array([0.3, 0.7])
LOGITS = np.log(PROBS)


def _good():
    return dict(loc=LOC, covariance_matrix=COV, probs=PROBS)


# One invalid argument at a time; the rest of the arguments are the valid ``_good()``
# (with ``covariance_matrix`` replaced when another covariance argument is given).
BAD = {
    "cov_not_pd": dict(covariance_matrix=np.array([[[1.0, 2.0], [2.0, 1.0]]] * K)),
    "cov_not_symmetric": dict(covariance_matrix=np.array([[[1.0, 0.5], [0.0, 1.0]]] * K)),
    "cov_nan": dict(covariance_matrix=np.array([[[1.0, np.nan], [np.nan, 1.0]]] * K)),
    "precision_not_pd": dict(covariance_matrix=None, precision_matrix=-np.broadcast_to(np.eye(D), (K, D, D))),
    "tril_negative_diagonal": dict(covariance_matrix=None, scale_tril=np.array([[[1.0, 0.0], [0.3, -1.0]]] * K)),
    "tril_not_triangular": dict(covariance_matrix=None, scale_tril=np.array([[[1.0, 0.4], [0.3, 1.0]]] * K)),
    "scale_negative": dict(covariance_matrix=None, scale=np.array([[1.0, -0.5], [1.0, 1.0]])),
    "scale_zero": dict(covariance_matrix=None, scale=np.array([[1.0, 0.0], [1.0, 1.0]])),
    "probs_not_normalised": dict(probs=np.array([0.3, 0.3])),
    "probs_negative": dict(probs=np.array([1.2, -0.2])),
    "logits_nan": dict(probs=None, logits=np.array([0.0, np.nan])),
    "loc_nan": dict(loc=np.array([[0.0, np.nan], [0.0, 0.0]])),
    "loc_inf": dict(loc=np.array([[0.0, np.inf], [0.0, 0.0]])),
}


def _kwargs(bad):
    kw = {**_good(), **bad}
    return {k: (None if v is None else np.asarray(v, ftype())) for k, v in kw.items() if v is not None}


def _numpyro_equivalent(kw):
    """NumPyro's own mixture of the same arguments (the reference behaviour)."""
    kw = dict(kw)
    loc = kw.pop("loc")
    if "probs" in kw:
        mixing = dist.Categorical(probs=kw.pop("probs"), validate_args=True)
    else:
        mixing = dist.Categorical(logits=kw.pop("logits"), validate_args=True)
    if "scale" in kw:
        comp = dist.Normal(loc, kw.pop("scale"), validate_args=True).to_event(1)
    else:
        comp = dist.MultivariateNormal(loc, **kw, validate_args=True)
    return dist.MixtureSameFamily(mixing, comp, validate_args=True)


def _ours(kw):
    kw = dict(kw)
    loc = kw.pop("loc")
    return GaussianMixture(loc, **kw, validate_args=True)


def _raises(fn) -> bool:
    try:
        fn()
    except ValueError:
        return True
    return False


MODES = ["eager", "jit_constant", "jit_traced", "jit_traced_loc"]


def _call(build, kw, mode, compile=False):
    """Build under ``mode``: eagerly; under ``jax.jit`` with every argument a constant;
    under ``jax.jit`` with every argument traced; under ``jax.jit`` with only ``loc`` traced.

    Validation happens while ``jax.jit`` traces, so the grid only traces
    (``jax.jit(f).trace``, no XLA compilation); ``compile`` runs the jitted function."""

    def run(f, *args):
        return f(*args) if compile else f.trace(*args)

    if mode == "eager":
        return lambda: build(kw)
    if mode == "jit_constant":
        return lambda: run(jax.jit(lambda: build(kw).mean))
    if mode == "jit_traced":
        return lambda: run(jax.jit(lambda a: build(a).mean), kw)
    rest = {k: v for k, v in kw.items() if k != "loc"}
    return lambda: run(jax.jit(lambda loc: build({"loc": loc, **rest}).mean), kw["loc"])


@pytest.mark.parametrize("case", ["cov_not_pd", "scale_negative"])
def test_issue_examples_raise_under_compiled_jit(case):
    """``jax.jit(lambda: GaussianMixture(loc, bad, validate_args=True))()`` raises, as
    NumPyro's MultivariateNormal / Normal mixtures do, when really compiled and run."""
    kw = _kwargs(BAD[case])
    assert _raises(_call(_numpyro_equivalent, kw, "jit_constant", compile=True))
    with pytest.raises(ValueError, match="covariance_matrix|scale"):
        _call(_ours, kw, "jit_constant", compile=True)()
    jax.jit(lambda: _ours(_kwargs({})))()  # valid constants pass


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(BAD))
def test_validation_raises_exactly_where_numpyro_does(case, mode):
    """Reference: NumPyro's ``MixtureSameFamily`` of ``MultivariateNormal`` /
    ``Normal(...).to_event(1)`` and ``Categorical`` raise a ``ValueError`` for an invalid
    constant argument, eagerly and under ``jax.jit``, and cannot check traced ones."""
    kw = _kwargs(BAD[case])
    numpyro_raises = _raises(_call(_numpyro_equivalent, kw, mode))
    ours_raises = _raises(_call(_ours, kw, mode))
    # Wherever NumPyro refuses the arguments, so does this class ...
    assert ours_raises or not numpyro_raises
    # ... and it checks every argument that is a constant, eagerly or under jit (NumPyro's
    # MultivariateNormal misses a constant non-finite loc under jit: it reshapes loc with
    # jnp.expand_dims first, which makes it a tracer), never a traced one.
    traced = mode == "jit_traced" or (mode == "jit_traced_loc" and case.startswith("loc"))
    assert ours_raises == (not traced)
    if not traced and not case.startswith("loc"):
        assert numpyro_raises  # the reference refuses these too


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "params",
    [dict(), dict(covariance_matrix=None, scale_tril=TRIL), dict(covariance_matrix=None, scale=SCALE),
     dict(covariance_matrix=None, precision_matrix=np.linalg.inv(COV)), dict(probs=None, logits=LOGITS)],
    ids=["cov-probs", "tril", "scale", "precision", "logits"],
)
def test_valid_arguments_pass_everywhere(params, mode):
    kw = _kwargs(params)
    assert not _raises(_call(_numpyro_equivalent, kw, mode))
    assert not _raises(_call(_ours, kw, mode))


def test_minus_inf_logits_are_zero_weights():
    """The one documented difference: NumPyro's ``real_vector`` constraint refuses a -inf
    logit, this class takes it as a zero weight (and refuses all -inf)."""
    kw = _kwargs(dict(probs=None, logits=np.array([0.0, -np.inf])))
    assert _raises(lambda: _numpyro_equivalent(kw))
    gm = _ours(kw)
    np.testing.assert_allclose(gm.probs, [1.0, 0.0])
    with pytest.raises(ValueError, match="at least one finite"):
        _ours(_kwargs(dict(probs=None, logits=np.array([-np.inf, -np.inf]))))


def test_validate_args_method_strict_under_jit():
    gm = _ours(_kwargs({}))
    gm.validate_args()
    with pytest.raises(RuntimeError, match="jitted"):
        jax.jit(lambda g: g.validate_args())(gm)
    jax.jit(lambda g: g.validate_args(strict=False))(gm)


# ------------------------------------------------------------------ arg_constraints
# Each constructor argument: (valid value, invalid value, event dimensions).
ARGS = {
    "loc": (LOC, np.array([[0.0, np.nan], [0.0, 0.0]]), 2),
    "covariance_matrix": (COV, np.array([[[1.0, 2.0], [2.0, 1.0]]] * K), 3),
    "scale_tril": (TRIL, np.array([[[1.0, 0.4], [0.3, 1.0]]] * K), 3),
    "precision_matrix": (np.linalg.inv(COV), -COV, 3),
    "scale": (SCALE, -SCALE, 2),
    "logits": (LOGITS, np.array([0.0, np.nan]), 1),
    "probs": (PROBS, np.array([0.3, 0.3]), 1),
}


@pytest.mark.parametrize("name", list(ARGS))
def test_arg_constraints_agree_with_validation(name):
    """The class declares a constraint per constructor argument (NumPyro's contract), with
    the argument's event dimensions; it accepts the valid value and refuses the invalid
    one, as does the constructor with ``validate_args=True``."""
    valid, invalid, event_dim = ARGS[name]
    c = GaussianMixture.arg_constraints[name]
    assert c.event_dim == event_dim
    assert bool(c(jnp.asarray(valid, ftype())))
    assert not bool(c(jnp.asarray(invalid, ftype())))
    base = {k: v for k, v in _good().items() if k in ("loc",)}
    cov = {} if name in ("loc", "logits", "probs") else {name: invalid}
    kw = {**base, **({"covariance_matrix": COV} if not cov else cov)}
    kw[name] = invalid
    loc = kw.pop("loc")
    with pytest.raises(ValueError, match=name):
        GaussianMixture(loc, **kw, validate_args=True)


def test_instance_arg_constraints_are_the_held_parameters():
    full = _ours(_kwargs({}))
    diag = _ours(_kwargs(dict(covariance_matrix=None, scale=SCALE)))
    assert set(GaussianMixture.arg_constraints) == set(ARGS) | {"cov_factor", "cov_diag"}  # low rank: tests/test_lowrank.py
    assert set(full.arg_constraints) == {"loc", "scale_tril", "logits", "probs"}
    assert set(diag.arg_constraints) == {"loc", "scale", "logits", "probs"}
    for d in (full, diag):
        args = d.get_args()
        assert set(args) == set(d.arg_constraints)
        for name, value in args.items():
            assert value is not None
            assert bool(jnp.all(d.arg_constraints[name](value))), name
    assert not full.has_rsample
    with pytest.raises(NotImplementedError):
        full.rsample(jax.random.PRNGKey(0))


# ------------------------------------------------------------------ pytree round trips
@pytest.mark.parametrize(
    "params",
    [dict(), dict(covariance_matrix=None, scale=SCALE, probs=None, logits=LOGITS)],
    ids=["full", "diagonal"],
)
def test_pytree_round_trips_keep_parameters(params):
    """``jax.jit`` (flatten/unflatten), ``lax.map`` and ``jax.vmap`` give back the same
    parameters and the entropy configuration, as NumPyro's ``test_dist_pytree`` asks."""
    kw = _kwargs(params)
    loc = kw.pop("loc")

    def make(_):
        return GaussianMixture(loc, **kw, entropy_method="mixing_qmc", entropy_order=3)

    eager = make(0)
    jitted = jax.jit(make)(0)
    mapped = lax.map(make, jnp.ones(3))
    vmapped = jax.vmap(make)(jnp.ones(3))
    for d in (jitted,):
        assert d.entropy_method == "mixing_qmc" and d.entropy_order == 3
        assert d.is_diagonal == eager.is_diagonal
        for name, value in eager.get_args().items():
            np.testing.assert_allclose(getattr(d, name), value, rtol=1e-6)
    for d in (mapped, vmapped):
        assert d.entropy_method == "mixing_qmc" and d.is_diagonal == eager.is_diagonal
        for name, value in eager.get_args().items():
            np.testing.assert_allclose(getattr(d, name), np.broadcast_to(value, (3,) + value.shape), rtol=1e-6)


# ------------------------------------------------------------------ infer_shapes
class _ScaleLogits(GaussianMixture):
    """A subclass with other positional arguments (as NumPyro's tests build them)."""

    def __init__(self, loc, scale, logits, *, validate_args=None):
        super().__init__(loc, scale=scale, logits=logits, validate_args=validate_args)


SHAPES = [
    # (class, positional shapes, keyword shapes)
    (GaussianMixture, ((2, 3),), dict(covariance_matrix=(2, 3, 3))),
    (GaussianMixture, ((4, 1, 2, 3), (5, 2, 3, 3)), dict()),
    (GaussianMixture, ((2, 3),), dict(scale=(6, 2, 3), logits=(1, 2))),
    (GaussianMixture, ((2, 3),), dict(precision_matrix=(2, 3, 3), probs=(7, 1, 2))),
    (GaussianMixture, (), dict(loc=(3, 2, 1), scale_tril=(2, 1, 1), entropy_method="auto")),
    (_ScaleLogits, ((2, 4), (3, 2, 4), (2,)), dict()),
]


@pytest.mark.parametrize("cls,args,kwargs", SHAPES)
def test_infer_shapes_matches_construction(cls, args, kwargs):
    """Expected: batch shape by NumPy's broadcasting rules over each argument's leading
    dimensions, event shape ``(d,)``; and the constructed distribution agrees."""
    names = ["loc", "covariance_matrix"] if cls is GaussianMixture else ["loc", "scale", "logits"]
    shapes = {**dict(zip(names, args)), **{k: v for k, v in kwargs.items() if k != "entropy_method"}}
    event = {"loc": 2, "covariance_matrix": 3, "scale_tril": 3, "precision_matrix": 3, "scale": 2, "logits": 1, "probs": 1}
    expected_batch = np.broadcast_shapes(*(s[: len(s) - event[k]] for k, s in shapes.items()))
    expected_event = (shapes["loc"][-1],)
    assert cls.infer_shapes(*args, **kwargs) == (expected_batch, expected_event)
    arrays = {}
    for k, s in shapes.items():
        if k in ("covariance_matrix", "precision_matrix"):
            arrays[k] = np.broadcast_to(np.eye(s[-1]), s)
        elif k == "scale_tril":
            arrays[k] = np.broadcast_to(np.eye(s[-1]), s)
        elif k in ("scale", "probs"):
            arrays[k] = np.full(s, 1.0 / s[-1] if k == "probs" else 1.0)
        else:
            arrays[k] = np.zeros(s)
    build = (lambda: cls(**arrays)) if cls is GaussianMixture else (lambda: cls(*(arrays[n] for n in names)))
    d = jax.eval_shape(build)  # the constructor, traced only
    assert (d.batch_shape, d.event_shape) == (expected_batch, expected_event)


def test_infer_shapes_refuses_what_the_constructor_refuses():
    with pytest.raises(ValueError, match="covariance_matrix must have shape"):
        GaussianMixture.infer_shapes((2, 3), (2, 2, 2))
    with pytest.raises(ValueError, match="exactly one"):
        GaussianMixture.infer_shapes((2, 3))
    with pytest.raises(ValueError, match="do not broadcast"):
        GaussianMixture.infer_shapes((3, 2, 3), (4, 2, 3, 3))
    with pytest.raises(ValueError, match="logits must have shape"):
        GaussianMixture.infer_shapes((2, 3), scale=(2, 3), logits=(3,))
    with pytest.raises(TypeError, match="unexpected"):
        GaussianMixture.infer_shapes((2, 3), (2, 3, 3), bogus=(1,))


# ------------------------------------------------------------------ annotations
ARRAY_MEMBERS = ["loc", "scale_tril", "component_covariance_matrix", "logits", "probs", "covariance_matrix",
                 "entropy", "mean", "variance", "log_prob", "sample", "cdf"]


@pytest.mark.parametrize("name", ARRAY_MEMBERS)
def test_array_members_are_annotated(name):
    """NumPyro's ``test_output_is_array`` asks ``Array`` (or ``ArrayLike`` on sample and
    log_prob) as the return annotation of methods returning arrays."""
    impl = getattr(GaussianMixture, name)
    impl = impl.fget if isinstance(impl, property) else impl
    hint = get_type_hints(impl)["return"]
    if name in ("sample", "log_prob"):
        assert hint in (Array, jax.typing.ArrayLike)
    else:
        assert hint is Array
    # (that the values are jax Arrays, eagerly and under jit, is upstream's test_output_is_array)


def test_other_annotations():
    assert get_type_hints(GaussianMixture.scale.fget)["return"] == Array | None
    assert get_type_hints(GaussianMixture.entropy_bounds)["return"] == tuple[Array, Array]
    assert get_type_hints(GaussianMixture.infer_shapes)["return"] == tuple[tuple[int, ...], tuple[int, ...]]
