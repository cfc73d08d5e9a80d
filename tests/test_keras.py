"""Keras itself as the oracle of the Keras converters: ``cgru.convert.from_keras`` and
``to_keras`` against real ``keras.layers.GRU`` (``reset_after`` both ways), ``LSTM`` and
``SimpleRNN``, stacked and ``Bidirectional``, with and without biases — the outputs, the final
states and, through JAX's autodiff of the Keras model, the gradients.

Keras 3 runs here on its JAX backend (JAX is a test dependency already); the test skips when
Keras is not installed.
"""
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
jax = pytest.importorskip("jax")

import cgru  # noqa: E402
from cgru import convert  # noqa: E402

if keras.backend.backend() != "jax":          # another backend was chosen before us
    pytest.skip("these tests drive Keras through its JAX backend", allow_module_level=True)

T, N, I, H = 6, 3, 4, 5
TOL = dict(rtol=2e-5, atol=2e-6)

CASES = {
    "GRU reset_after": (lambda **kw: keras.layers.GRU(H, reset_after=True, **kw),
                        dict(reset_after=True)),
    "GRU reset_before": (lambda **kw: keras.layers.GRU(H, reset_after=False, **kw),
                         dict(reset_after=False)),
    "LSTM": (lambda **kw: keras.layers.LSTM(H, **kw), {}),
    "SimpleRNN": (lambda **kw: keras.layers.SimpleRNN(H, **kw), {}),
    "SimpleRNN relu": (lambda **kw: keras.layers.SimpleRNN(H, activation="relu", **kw),
                       dict(activation="relu")),
}


def _model(make, layers, bidirectional, use_bias=True, return_state=False):
    """A Keras model of ``layers`` stacked recurrent layers over ``[N, T, I]``."""
    inp = keras.Input((T, I))
    h = inp
    for l in range(layers):
        last = l == layers - 1
        layer = make(return_sequences=True, use_bias=use_bias,
                     return_state=return_state and last)
        if bidirectional:
            layer = keras.layers.Bidirectional(layer, merge_mode="concat")
        h = layer(h)
    return keras.Model(inp, h)


def _randomise(model, seed):
    rng = np.random.default_rng(seed)
    for layer in model.layers[1:]:
        layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32)
                           for w in layer.get_weights()])
    return [layer.get_weights() for layer in model.layers[1:]]


def _x(seed=1):
    return np.random.default_rng(seed).standard_normal((N, T, I)).astype(np.float32)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_from_keras_computes_what_keras_computes(case, layers, bidirectional):
    make, kw = CASES[case]
    model = _model(make, layers, bidirectional)
    weights = _randomise(model, seed=len(case) + 10 * layers + bidirectional)
    x = _x()
    want = np.asarray(model(x))
    net = convert.from_keras(weights, bidirectional=bidirectional, **kw)
    got = cgru.forward(net, x, batch_major=True).y                 # the network's own cell
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_final_states_and_no_bias(case):
    make, kw = CASES[case]
    model = _model(make, 1, False, use_bias=False, return_state=True)
    weights = _randomise(model, seed=3)
    x = _x(2)
    y, *states = [np.asarray(a) for a in model(x)]
    net = convert.from_keras(weights, **kw)
    f = cgru.forward(net, x, batch_major=True)
    np.testing.assert_allclose(f.y, y, **TOL)
    np.testing.assert_allclose(f.hy[0], states[0], **TOL)
    if "LSTM" in case:
        np.testing.assert_allclose(f.cy[0], states[1], **TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_to_keras_weights_make_keras_compute_cgru(case):
    make, kw = CASES[case]
    cell = convert.from_keras(_randomise(_model(make, 1, False), 0), **kw).cell
    net = cgru.Network.random(cgru.Topology(I, H, 2, "bidirectional"), np.float32, seed=4,
                              cell=cell, scale=0.6)
    model = _model(make, 2, True)
    for layer, w in zip(model.layers[1:], convert.to_keras(net)):
        layer.set_weights(w)
    x = _x(3)
    np.testing.assert_allclose(np.asarray(model(x)), cgru.forward(net, x, batch_major=True).y,
                               **TOL)
    layer_config = make().get_config()
    assert all(layer_config[k] == v for k, v in convert.keras_config(net).items())


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_agree_with_jax_autodiff_of_the_keras_model(case):
    """The gradient to the input and to each kernel and recurrent kernel (the biases are one
    vector in Keras where cuDNN has two, so they are compared where they are the same)."""
    make, kw = CASES[case]
    model = _model(make, 2, True)
    weights = _randomise(model, seed=5)
    x = _x(4)
    dy = np.random.default_rng(6).standard_normal(np.asarray(model(x)).shape).astype(np.float32)
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]

    def loss(tv, xx):
        out = model.stateless_call(tv, frozen, xx)[0]
        return (out * dy).sum()
    g_w, g_x = jax.grad(loss, argnums=(0, 1))(trainable, x)
    names = [v.path for v in model.trainable_variables]

    net = convert.from_keras(weights, bidirectional=True, **kw)
    f = cgru.forward(net, x, batch_major=True, training=True)
    g = cgru.backward(net, x, f.reserve, dy, batch_major=True)
    np.testing.assert_allclose(g.dx, np.asarray(g_x), **TOL)
    mine = [a for layer in convert.to_keras(g.dparams.with_cell(net.cell)) for a in layer]
    two_biases = case == "GRU reset_after"
    checked = 0
    for name, want, got in zip(names, g_w, mine):
        if name.endswith("bias") and not two_biases:
            continue                 # Keras' one bias: its gradient is cuDNN's db_W (= db_R)
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-5, err_msg=name)
        checked += 1
    assert checked >= 8
