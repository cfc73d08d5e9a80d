"""Shared test fixtures: buffer poisoning for the engine, and torch.nn.GRU built from a cgru.Network.

* ``poison``: every buffer ``cgru.engine`` allocates (outputs, reserve, workspaces — all go
  through ``cgru.core.plan.empty``) starts as NaN (float arrays) or 0xFF bytes (the uint8
  reserve; 0xFF…FF read as a float is a NaN), so an element the engine forgets to write shows up
  as a NaN in a result.
* ``torch_gru_from_params``: ``build(params, batch_first=False) -> torch.nn.GRU`` with cgru's
  canonical weights copied in (same r, z, n gate order: ``weight_ih_l{k}[_reverse] = W``,
  ``weight_hh = R``, ``bias_ih = b_W``, ``bias_hh = b_R``).
* ``torch_gru_run``: ``run(params, x, h0=None, *, lengths=None, batch_first=False, dy=None,
  dhy=None) -> dict`` with PyTorch's ``y``, ``hy`` and, when ``dy`` or ``dhy`` is given, the
  autograd gradients of ``Σ y·dy + Σ hy·dhy``: ``dx``, ``dh0`` (also when ``h0`` is None: the
  gradient at h0 = 0) and ``dparams`` (a ``cgru.Network``).
"""
import glob
import os

# Teams of the size a call asks for, even on a loaded machine (cgru's opt-in backoff shrinks
# them after teams held up by other processes: parallel.h), so that the tests that count teams
# hold while the suite shares the machine; tests/test_backoff.py turns the backoff on where it
# tests it.  Set before cgru is imported (it reads it once), and inherited by subprocesses.
os.environ["CGRU_TEAMS_BACKOFF"] = "0"
# Likewise every team is woken, however long its threads have slept (cgru otherwise runs a
# short region on its caller alone when this machine has been waking them slowly: parallel.h,
# cold teams); tests/test_backoff.py turns that rule on where it tests it.
os.environ["CGRU_COLD_TEAMS"] = "0"

import signal
import threading

import numpy as np
import pytest


def pytest_sessionfinish(session):
    """An xdist worker still tearing down 5 s after the controller asked it to exit (the
    end-of-session garbage collection of torch's, TF's and JAX's objects, on a loaded machine)
    is sent SIGINT by execnet, pytest-xdist's transport; the KeyboardInterrupt then lands in
    whatever garbage-collector callback or finalizer runs at that moment and is reported as an
    unraisable exception after the last test.  The tests are over: the worker ignores SIGINT
    and finishes its teardown (execnet still ends a worker that has not finished 10 s later)."""
    if os.environ.get("PYTEST_XDIST_WORKER") and \
            threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


_TORCH_NAMES = (("W", "weight_ih"), ("R", "weight_hh"), ("b_W", "bias_ih"), ("b_R", "bias_hh"))


def _poisoned_empty(shape, dtype):
    a = np.empty(shape, dtype)
    if a.dtype.kind == "f":
        a.fill(np.nan)
    else:
        a.reshape(-1).view(np.uint8).fill(0xFF)
    return a


@pytest.fixture
def poison(monkeypatch):
    """Make ``cgru.core.plan.empty`` return NaN-filled (float) / 0xFF-filled (other) arrays."""
    from cgru.core import plan
    monkeypatch.setattr(plan, "empty", _poisoned_empty)
    monkeypatch.setattr(plan, "_reuse", False)          # every buffer fresh, so poisoned
    return _poisoned_empty


def _torch_suffix(layer, d):
    return f"_l{layer}" + ("_reverse" if d == 1 else "")


def _build_torch_gru(params, batch_first=False):
    import torch
    topo = params.topology
    if topo.direction == "reverse" or topo.input_mode != "linear":
        raise ValueError(f"torch.nn.GRU has no equivalent of {topo}")
    tdtype = torch.float64 if params.dtype == np.float64 else torch.float32
    gru = torch.nn.GRU(topo.input_size, topo.hidden_size, num_layers=topo.num_layers,
                       bidirectional=topo.direction == "bidirectional",
                       batch_first=bool(batch_first), dtype=tdtype)
    with torch.no_grad():
        for layer in range(topo.num_layers):
            for d in range(topo.num_directions):
                lp = params[layer, d]
                for ours, theirs in _TORCH_NAMES:
                    getattr(gru, theirs + _torch_suffix(layer, d)).copy_(
                        torch.from_numpy(getattr(lp, ours)))
    return gru


def _run_torch_gru(params, x, h0=None, *, lengths=None, batch_first=False, dy=None, dhy=None):
    import torch
    from cgru import LayerParams, Network
    topo = params.topology
    batch_first = bool(batch_first)
    gru = _build_torch_gru(params, batch_first)
    N = x.shape[0] if batch_first else x.shape[1]
    T = x.shape[1] if batch_first else x.shape[0]
    if h0 is None:
        h0 = np.zeros((topo.num_layer_directions, N, topo.hidden_size), params.dtype)
    xt = torch.from_numpy(np.array(x)).requires_grad_()
    ht = torch.from_numpy(np.array(h0)).requires_grad_()
    if lengths is None:
        y, hy = gru(xt, ht)
    else:
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            xt, torch.as_tensor(np.asarray(lengths, dtype=np.int64)), batch_first=batch_first,
            enforce_sorted=False)
        y, hy = gru(packed, ht)
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, batch_first=batch_first, total_length=T)
    out = {"y": y.detach().numpy(), "hy": hy.detach().numpy()}
    if dy is None and dhy is None:
        return out
    loss = 0
    if dy is not None:
        loss = loss + (y * torch.from_numpy(dy)).sum()
    if dhy is not None:
        loss = loss + (hy * torch.from_numpy(dhy)).sum()
    loss.backward()
    out["dx"] = xt.grad.numpy()
    out["dh0"] = ht.grad.numpy()
    layers = []
    for layer in range(topo.num_layers):
        for d in range(topo.num_directions):
            layers.append(LayerParams(**{
                ours: getattr(gru, theirs + _torch_suffix(layer, d)).grad.numpy().copy()
                for ours, theirs in _TORCH_NAMES}))
    out["dparams"] = Network(topo, layers)
    return out


@pytest.fixture
def torch_gru_from_params():
    """``build(params, batch_first=False) -> torch.nn.GRU`` (skips when torch is missing)."""
    pytest.importorskip("torch")
    return _build_torch_gru


@pytest.fixture
def torch_gru_run():
    """``run(params, x, h0=None, *, lengths, batch_first, dy, dhy) -> dict`` (see module doc)."""
    pytest.importorskip("torch")
    return _run_torch_gru


# --- activation cells shared by test_engine and test_gradients ----------------------------------
import cgru  # noqa: E402

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(cgru.__file__)))
"""The directory the cgru under test is imported from: the checkout (an editable install) or
site-packages (an installed wheel).  The tests' fresh interpreters run in it, with it first on
``PYTHONPATH`` (``package_env``), so they import that same cgru — never a source tree that
would shadow an installed wheel."""


def package_env(**extra):
    """``os.environ`` with ``PACKAGE_DIR`` first on ``PYTHONPATH``, and ``extra``."""
    path = [PACKAGE_DIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), **extra)

ACTIVATION_KINDS = cgru.ACTIVATION_NAMES
# Non-default alpha/beta for each kind (ignored by the kinds without parameters).
ACTIVATION_AB = {"hard_sigmoid": (0.3, 0.45), "affine": (0.8, 0.1), "leaky_relu": (0.15, 0.0),
                 "thresholded_relu": (0.2, 0.0), "scaled_tanh": (1.3, 0.7), "elu": (0.6, 0.0)}


def activation(name):
    return cgru.Activation(name, *ACTIVATION_AB.get(name, (0.5, -0.5)))


def activation_cell(k, z_shift, g_shift, parity):
    """Case k of 12: with shifts coprime to 12, every kind appears once as f_r, once as f_z
    and once as g over k = 0…11; ``parity`` picks which cases are reset-after / flip_z."""
    n = len(ACTIVATION_KINDS)
    return cgru.Cell(reset_after=k % 2 == parity, flip_z=k % 3 == parity,
                     f_r=activation(ACTIVATION_KINDS[k]),
                     f_z=activation(ACTIVATION_KINDS[(k + z_shift) % n]),
                     g=activation(ACTIVATION_KINDS[(k + g_shift) % n]))


# --- torch nn.GRU / nn.LSTM / nn.RNN built from any cgru.Network ---------------------------------
def build_torch_rnn(net, batch_first=False):
    """The torch module computing ``net`` (GRU, LSTM with or without projection, RNN tanh/relu),
    its weights copied in (the gate orders agree: r, z, n and i, f, g, o)."""
    import torch
    topo, cell = net.topology, net.cell
    if topo.direction == "reverse" or topo.input_mode != "linear":
        raise ValueError(f"torch has no equivalent of {topo}")
    kw = dict(num_layers=topo.num_layers, bidirectional=topo.direction == "bidirectional",
              batch_first=bool(batch_first),
              dtype=torch.float64 if net.dtype == np.float64 else torch.float32)
    if cell.kind == "gru":
        mod = torch.nn.GRU(topo.input_size, topo.hidden_size, **kw)
    elif cell.kind == "lstm":
        mod = torch.nn.LSTM(topo.input_size, topo.hidden_size, proj_size=topo.proj_size, **kw)
    else:
        mod = torch.nn.RNN(topo.input_size, topo.hidden_size,
                           nonlinearity=cell.activation.name, **kw)
    names = _TORCH_NAMES + (("W_p", "weight_hr"),)
    with torch.no_grad():
        for layer in range(topo.num_layers):
            for d in range(topo.num_directions):
                lp = net[layer, d]
                for ours, theirs in names:
                    a = getattr(lp, ours)
                    if a is not None:
                        getattr(mod, theirs + _torch_suffix(layer, d)).copy_(torch.from_numpy(a))
    return mod


def run_torch_rnn(net, x, h0=None, c0=None, *, lengths=None, batch_first=False, dy=None,
                  dhy=None, dcy=None):
    """torch's ``y``, ``hy`` (``cy``) for ``net`` and, when output gradients are given, the
    autograd gradients of ``Σ y·dy + Σ hy·dhy + Σ cy·dcy``: ``dx``, ``dh0`` (``dc0``) and
    ``dparams`` (a ``cgru.Network``)."""
    import torch
    from cgru import LayerParams, Network
    topo, lstm = net.topology, net.cell.kind == "lstm"
    mod = build_torch_rnn(net, batch_first)
    N = x.shape[0] if batch_first else x.shape[1]
    T = x.shape[1] if batch_first else x.shape[0]
    LD = topo.num_layer_directions
    if h0 is None:
        h0 = np.zeros((LD, N, topo.state_size), net.dtype)
    if lstm and c0 is None:
        c0 = np.zeros((LD, N, topo.hidden_size), net.dtype)
    xt = torch.from_numpy(np.array(x)).requires_grad_()
    ht = torch.from_numpy(np.array(h0)).requires_grad_()
    ct = torch.from_numpy(np.array(c0)).requires_grad_() if lstm else None
    state = (ht, ct) if lstm else ht
    inp = xt
    if lengths is not None:
        inp = torch.nn.utils.rnn.pack_padded_sequence(
            xt, torch.as_tensor(np.asarray(lengths, np.int64)), batch_first=batch_first,
            enforce_sorted=False)
    y, hy = mod(inp, state)
    if lengths is not None:
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, batch_first=batch_first,
                                                      total_length=T)
    hy, cy = (hy if lstm else (hy, None))
    out = {"y": y.detach().numpy(), "hy": hy.detach().numpy()}
    if lstm:
        out["cy"] = cy.detach().numpy()
    if dy is None and dhy is None and dcy is None:
        return out
    loss = 0
    for t, g in ((y, dy), (hy, dhy), (cy, dcy)):
        if g is not None:
            loss = loss + (t * torch.from_numpy(g)).sum()
    loss.backward()
    out["dx"], out["dh0"] = xt.grad.numpy(), ht.grad.numpy()
    if lstm:
        out["dc0"] = ct.grad.numpy()
    layers = []
    for layer in range(topo.num_layers):
        for d in range(topo.num_directions):
            grads = {}
            for ours, theirs in _TORCH_NAMES + (("W_p", "weight_hr"),):
                p = getattr(mod, theirs + _torch_suffix(layer, d), None)
                if p is not None:
                    grads[ours] = p.grad.numpy().copy()
            layers.append(LayerParams(**grads))
    out["dparams"] = Network(topo, layers, net.cell)
    return out


def find_libomp():
    """LLVM's OpenMP runtime (``CGRU_TEST_LIBOMP``, or a system install), or None: the fork and
    threadpoolctl tests run again with it preloaded in place of the runtime cgru was built with."""
    candidates = [os.environ.get("CGRU_TEST_LIBOMP", "")]
    candidates += sorted(glob.glob("/usr/lib/llvm-*/lib/libomp.so.5"), reverse=True)
    candidates += glob.glob("/usr/lib/*-linux-gnu/libomp.so.5") + glob.glob("/usr/lib/libomp.so*")
    return next((c for c in candidates if c and os.path.exists(c)), None)


def preload(library):
    """``LD_PRELOAD`` with ``library`` after what is preloaded already (the sanitizer runtime of
    a debug build must stay first)."""
    before = os.environ.get("LD_PRELOAD", "")
    return f"{before}:{library}" if before else library
