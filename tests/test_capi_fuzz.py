"""Property-based fuzzing (hypothesis) of the C ABI, loaded into this process with ctypes.

For random descriptors — every cell mode (GRU either candidate form, LSTM with and without a
projection, both vanilla RNNs), dtypes, layers, directions, input modes, dropout, thread
counts — and random calls — sizes, layouts, sequence lengths, optional states given or NULL —
a training step through ``cgru_rnn_forward_ex``, ``cgru_rnn_backward_data_ex`` and
``cgru_rnn_backward_weights`` gives bit for bit what ``cgru.forward`` and ``cgru.backward``
give; and with one argument of one of the three calls made wrong (a size one byte short, a
required pointer NULL, a length out of range, an unknown enum value, a changed reserve space,
a descriptor field out of range, a state for a cell without one), that call returns its
documented status with a message naming the argument, writes none of its outputs, changes no
input, and the same step made right afterwards still gives the same bits.

Examples are derandomized (CI runs the same cases every time); ``CGRU_FUZZ_SCALE=k`` runs k
times as many at random, as ``test_fuzz.py`` does.
"""
import ctypes
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import cgru  # noqa: E402
import test_capi  # noqa: E402
from test_capi import _CELLS, _desc_v2, _ptr  # noqa: E402

lib = test_capi.lib         # the fixture: libcgru loaded into this process

SCALE = int(os.environ.get("CGRU_FUZZ_SCALE") or 0)
FUZZ = settings(max_examples=60 * max(SCALE, 1), deadline=None, derandomize=not SCALE,
                database=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.function_scoped_fixture])
BAD_PARAM, BUFFER_TOO_SMALL = 1, 6

# (call, what is made wrong, the status, the name the message must hold)
WRONGS = [
    ("forward", "weight_space_size", BUFFER_TOO_SMALL, "weight_space_size"),
    ("forward", "reserve_space_size", BUFFER_TOO_SMALL, "reserve_space_size"),
    ("forward", "work_space_size", BUFFER_TOO_SMALL, "work_space_size"),
    ("forward", "x", BAD_PARAM, "x"),
    ("forward", "y", BAD_PARAM, "y"),
    ("forward", "reserve_space", BAD_PARAM, "reserve_space"),
    ("forward", "seq_lengths_high", BAD_PARAM, "seq_lengths"),
    ("forward", "seq_lengths_negative", BAD_PARAM, "seq_lengths"),
    ("forward", "max_seq_length", BAD_PARAM, "max_seq_length"),
    ("forward", "batch_size", BAD_PARAM, "batch_size"),
    ("forward", "fwd_mode", BAD_PARAM, "fwd_mode"),
    ("forward", "layout", BAD_PARAM, "layout"),
    ("forward", "cell_state", BAD_PARAM, "cx"),
    ("forward", "hidden_size", BAD_PARAM, "hidden_size"),
    ("forward", "dropout", BAD_PARAM, "dropout"),
    ("forward", "cell_mode", BAD_PARAM, "cell_mode"),
    ("backward_data", "dx", BAD_PARAM, "dx"),
    ("backward_data", "weight_space_size", BUFFER_TOO_SMALL, "weight_space_size"),
    ("backward_data", "reserve_header", BAD_PARAM, "reserve_space"),
    ("backward_data", "other_lengths", BAD_PARAM, "reserve_space"),
    ("backward_data", "other_layout", BAD_PARAM, "reserve_space"),
    ("backward_weights", "wgrad_mode", BAD_PARAM, "wgrad_mode"),
    ("backward_weights", "dweight_space", BAD_PARAM, "dweight_space"),
    ("backward_weights", "reserve_space_size", BUFFER_TOO_SMALL, "reserve_space_size"),
]


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(sorted(_CELLS)))
    H = draw(st.integers(1, 5))
    mode = draw(st.sampled_from(("linear", "linear", "skip")))
    L = draw(st.integers(1, 3))
    T, N = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    return dict(
        kind=kind, dtype=draw(st.sampled_from((np.float32, np.float64))), T=T, N=N,
        topo=cgru.Topology(H if mode == "skip" else draw(st.integers(1, 5)), H, L,
                           draw(st.sampled_from(("forward", "reverse", "bidirectional"))),
                           mode, draw(st.integers(0, H - 1)) if kind == "lstm" else 0),
        reset_after=draw(st.booleans()), batch_major=draw(st.booleans()),
        lengths=draw(st.one_of(st.none(), st.lists(st.integers(0, T), min_size=N,
                                                   max_size=N))),
        hx=draw(st.booleans()), cx=draw(st.booleans()), dhy=draw(st.booleans()),
        dropout=draw(st.sampled_from((0.0, 0.4))) if L > 1 else 0.0,
        num_threads=draw(st.sampled_from((1, 2))), work=draw(st.booleans()),
        wrong=draw(st.one_of(st.none(), st.sampled_from(WRONGS))),
        data=draw(st.integers(0, 2 ** 32 - 1)))


class _Step:
    """One training step of a case through the C ABI: its buffers, and each call with one
    argument made wrong (``wrong``) or none."""

    def __init__(self, lib, c):
        self.lib, self.c = lib, c
        topo, dt, kind = c["topo"], c["dtype"], c["kind"]
        cell = cgru.GRUCell(reset_after=c["reset_after"]) if kind == "gru" else _CELLS[kind]
        self.desc = _desc_v2(lib, topo, kind, dt, reset_after=int(c["reset_after"]),
                             dropout=c["dropout"], seed=7, seed2=-2,
                             num_threads=c["num_threads"])
        self.net = cgru.Network.random(topo, dt, seed=c["data"] % 1000, cell=cell)
        rng = np.random.default_rng(c["data"])
        T, N, LD = c["T"], c["N"], topo.num_layer_directions
        self.lstm = kind == "lstm"
        self.x = rng.standard_normal((N, T, topo.input_size) if c["batch_major"]
                                     else (T, N, topo.input_size)).astype(dt)
        self.hx = rng.standard_normal((LD, N, topo.state_size)).astype(dt) if c["hx"] else None
        self.cx = rng.standard_normal((LD, N, topo.hidden_size)).astype(dt) \
            if self.lstm and c["cx"] else None
        self.lengths = None if c["lengths"] is None else np.array(c["lengths"], np.int32)
        ys = (N, T, topo.output_size) if c["batch_major"] else (T, N, topo.output_size)
        self.dy = rng.standard_normal(ys).astype(dt)
        self.dhy = rng.standard_normal((LD, N, topo.state_size)).astype(dt) \
            if c["dhy"] else None
        self.dcy = rng.standard_normal((LD, N, topo.hidden_size)).astype(dt) \
            if self.lstm and c["dhy"] else None
        self.weights = self.net.flat()
        sizes = [ctypes.c_size_t() for _ in range(3)]
        assert lib.cgru_get_weight_space_size(ctypes.byref(self.desc),
                                              ctypes.byref(sizes[0])) == 0
        assert lib.cgru_get_temp_space_sizes(ctypes.byref(self.desc), 1, T, N,
                                             ctypes.byref(sizes[1]),
                                             ctypes.byref(sizes[2])) == 0
        self.wbytes, self.work_bytes, self.reserve_bytes = (s.value for s in sizes)
        self.reserve = np.zeros(self.reserve_bytes, np.uint8)
        self.work = np.empty(max(self.work_bytes, 1), np.uint8) if c["work"] else None
        self.inputs = [a for a in (self.x, self.hx, self.cx, self.lengths, self.dy, self.dhy,
                                   self.dcy, self.weights) if a is not None]
        self.originals = [a.copy() for a in self.inputs]
        shape = (LD, N, topo.state_size)
        cshape = (LD, N, topo.hidden_size)
        self.y, self.hy = np.full(ys, np.nan, dt), np.full(shape, np.nan, dt)
        self.cy = np.full(cshape, np.nan, dt) if self.lstm else None
        self.dx, self.dhx = np.full_like(self.x, np.nan), np.full(shape, np.nan, dt)
        self.dcx = np.full(cshape, np.nan, dt) if self.lstm else None
        self.dw = np.full_like(self.weights, np.nan)

    def _common(self, wrong):
        """``(desc, layout, T, N, seq_lengths)`` of a call, one of them made wrong."""
        c, desc = self.c, self.desc
        if wrong in ("hidden_size", "dropout", "cell_mode"):
            desc = type(self.desc).from_buffer_copy(self.desc)
            setattr(desc, wrong, {"hidden_size": 0, "dropout": 1.0, "cell_mode": 9}[wrong])
        lengths = self.lengths
        if wrong in ("seq_lengths_high", "seq_lengths_negative", "other_lengths"):
            lengths = np.full(c["N"], c["T"], np.int32) if lengths is None else lengths.copy()
            lengths[c["data"] % c["N"]] = {"seq_lengths_high": c["T"] + 1,
                                           "seq_lengths_negative": -1,
                                           "other_lengths": 0}[wrong]
            if wrong == "other_lengths" and self.lengths is not None and \
                    np.array_equal(lengths, self.lengths):
                lengths[c["data"] % c["N"]] = 1 if c["T"] > 1 else 0
                if np.array_equal(lengths, self.lengths):
                    lengths = None
        layout = int(c["batch_major"])
        if wrong == "layout":
            layout = 5
        elif wrong == "other_layout":
            layout = 1 - layout
        T = 0 if wrong == "max_seq_length" else c["T"]
        N = 0 if wrong == "batch_size" else c["N"]
        return ctypes.byref(desc), layout, T, N, _ptr(lengths)

    def forward(self, wrong=None):
        wbytes = self.wbytes - (wrong == "weight_space_size")
        rbytes = self.reserve_bytes - (wrong == "reserve_space_size")
        work, work_bytes = (None, 0) if self.work is None else (self.work, self.work_bytes)
        if wrong == "work_space_size":
            work = self.work if self.work is not None else np.empty(1, np.uint8)
            work_bytes = self.work_bytes - 1 if self.work_bytes > 1 else 1
        cx = self.cx
        if wrong == "cell_state":
            cx = None if self.lstm else np.zeros(1, self.c["dtype"])
        desc, *call = self._common(wrong)
        return self.lib.cgru_rnn_forward_ex(
            desc, 7 if wrong == "fwd_mode" else 1, *call,
            None if wrong == "x" else _ptr(self.x), None if wrong == "y" else _ptr(self.y),
            _ptr(self.hx), _ptr(self.hy), _ptr(cx), _ptr(self.cy),
            ctypes.c_size_t(wbytes), _ptr(self.weights),
            ctypes.c_size_t(work_bytes), _ptr(work), ctypes.c_size_t(rbytes),
            None if wrong == "reserve_space" else _ptr(self.reserve))

    def backward_data(self, wrong=None):
        if wrong == "reserve_header":
            self.reserve[8 * (self.c["data"] % 4)] ^= 0x10    # magic, version, state, flags
        try:
            return self.lib.cgru_rnn_backward_data_ex(
                *self._common(wrong), _ptr(self.dy), None if wrong == "dx" else _ptr(self.dx),
                _ptr(self.dhy), _ptr(self.dhx), _ptr(self.dcy), _ptr(self.dcx),
                ctypes.c_size_t(self.wbytes - (wrong == "weight_space_size")),
                _ptr(self.weights), ctypes.c_size_t(0), None,
                ctypes.c_size_t(self.reserve_bytes), _ptr(self.reserve))
        finally:
            if wrong == "reserve_header":
                self.reserve[8 * (self.c["data"] % 4)] ^= 0x10

    def backward_weights(self, wrong=None):
        return self.lib.cgru_rnn_backward_weights(
            ctypes.byref(self.desc), 9 if wrong == "wgrad_mode" else 1,
            *self._common(wrong)[1:], ctypes.c_size_t(self.wbytes),
            None if wrong == "dweight_space" else _ptr(self.dw), ctypes.c_size_t(0), None,
            ctypes.c_size_t(self.reserve_bytes - (wrong == "reserve_space_size")),
            _ptr(self.reserve))

    def outputs(self, call):
        return {"forward": [self.y, self.hy, self.cy],
                "backward_data": [self.dx, self.dhx, self.dcx],
                "backward_weights": [self.dw]}[call]


def _applies(c, what):
    """Whether ``what`` can be made wrong in case ``c`` (a call without that argument, or
    whose wrong value would be a right one, cannot)."""
    if what == "cell_state":
        return c["kind"] != "lstm"        # (an LSTM's cx may be NULL: zeros)
    if what == "work_space_size":
        return c["work"]
    if what == "dropout":
        return c["topo"].num_layers > 1
    return True


@FUZZ
@given(c=cases())
def test_a_training_step_from_c_equals_the_python_api_and_one_wrong_argument_is_refused(lib,
                                                                                        c):
    step = _Step(lib, c)
    if c["wrong"] is not None and _applies(c, c["wrong"][1]):
        call, what, status, name = c["wrong"]
        for before in ("forward", "backward_data", "backward_weights"):
            if before == call:
                break
            assert getattr(step, before)() == 0, lib.cgru_get_last_error_message().decode()
        outputs = [None if a is None else a.copy() for a in step.outputs(call)]
        got = getattr(step, call)(what)
        message = lib.cgru_get_last_error_message().decode()
        assert got == status, (what, got, message)
        assert name in message, (what, message)
        for a, b in zip(step.outputs(call), outputs):          # nothing written
            assert a is None or np.array_equal(a, b, equal_nan=True), (what, message)
        for a, b in zip(step.inputs, step.originals):           # nothing changed
            assert np.array_equal(a, b), (what, message)
    for call in ("forward", "backward_data", "backward_weights"):
        assert getattr(step, call)() == 0, (call, lib.cgru_get_last_error_message().decode())
    for a, b in zip(step.inputs, step.originals):
        assert np.array_equal(a, b)
    f = cgru.forward(step.net, step.x, step.hx, c0=step.cx, lengths=step.lengths,
                     batch_major=c["batch_major"], training=True, dropout=c["dropout"],
                     seed=(7, -2))
    g = cgru.backward(step.net, step.x, f.reserve, step.dy, step.dhy, dcy=step.dcy,
                      batch_major=c["batch_major"])
    want = [f.y, f.hy, g.dx, g.dh0, g.dparams.flat()]
    got = [step.y, step.hy, step.dx, step.dhx, step.dw]
    if step.lstm:
        want += [f.cy, g.dc0]
        got += [step.cy, step.dcx]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
