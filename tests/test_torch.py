"""``cgru.torch``: drop-in ``GRU``/``LSTM``/``RNN`` modules against ``torch.nn``'s own.

Oracles: ``torch.nn.GRU``/``LSTM``/``RNN`` with autograd (outputs, final states and every
gradient — input, ``h_0``/``c_0``, each parameter — over kinds, layers, directions,
``batch_first``, padded / packed unsorted / unbatched input, ``hx`` given or not, both dtypes);
``torch.autograd.gradcheck`` (float64 finite differences through ``functional_call``);
``state_dict`` in both directions; ``swap`` on a model; SGD training reaching the same weights;
dropout seeded by torch's RNG; the errors.  The whole file is skipped without torch.
"""
import copy
import io
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cgru  # noqa: E402
import cgru.torch as ct  # noqa: E402
from torch import nn  # noqa: E402
from torch.func import functional_call  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

I, H, P = 4, 5, 3
KINDS = {
    "gru": (nn.GRU, ct.GRU, {}),
    "lstm": (nn.LSTM, ct.LSTM, {}),
    "lstm_proj": (nn.LSTM, ct.LSTM, {"proj_size": P}),
    "rnn_tanh": (nn.RNN, ct.RNN, {"nonlinearity": "tanh"}),
    "rnn_relu": (nn.RNN, ct.RNN, {"nonlinearity": "relu"}),
}
DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}    # max |Δ| relative to max |reference|


def assert_close(got, want, dtype, what):
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)} != {list(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    scale = max(want.abs().max().item(), 1e-30) if want.numel() else 1.0
    err = (got - want).abs().max().item() if want.numel() else 0.0
    assert err <= TOL[dtype] * scale, f"{what}: max |Δ| = {err:.3g} > {TOL[dtype]} × {scale:.3g}"


def pair(kind, dtype=torch.float64, **kw):
    """``(torch module, cgru module)`` with the same weights (torch's random init)."""
    theirs, ours, extra = KINDS[kind]
    torch.manual_seed(0)
    ref = theirs(I, H, dtype=dtype, **extra, **kw)
    mine = ours(I, H, dtype=dtype, **extra, **kw)
    mine.load_state_dict(ref.state_dict())
    return ref, mine


def is_lstm(module):
    return isinstance(module, nn.LSTM)


def make_inputs(module, T, N, dtype, *, batched=True, with_hx=True, seed=1):
    """``(x, hx)``: x ``[T, N, I]`` (``[N, T, I]`` batch-first; ``[T, I]`` unbatched)."""
    g = torch.Generator().manual_seed(seed)
    xs = ((N, T, I) if module.batch_first else (T, N, I)) if batched else (T, I)
    x = torch.randn(xs, generator=g, dtype=dtype)
    if not with_hx:
        return x, None
    LD = module.num_layers * (2 if module.bidirectional else 1)
    S = getattr(module, "proj_size", 0) or H
    hs, cs = ((LD, N, S), (LD, N, H)) if batched else ((LD, S), (LD, H))
    h = torch.randn(hs, generator=g, dtype=dtype)
    if is_lstm(module):
        return x, (h, torch.randn(cs, generator=g, dtype=dtype))
    return x, h


def run(module, x, hx=None, lengths=None, seed=2):
    """Outputs of ``module`` and the gradients of a fixed random linear function of them."""
    x = x.detach().clone().requires_grad_()
    leaves = [x]
    if hx is not None:
        hx = tuple(h.detach().clone().requires_grad_() for h in hx) if is_lstm(module) \
            else hx.detach().clone().requires_grad_()
        leaves += list(hx) if is_lstm(module) else [hx]
    inp = x
    if lengths is not None:
        inp = pack_padded_sequence(x, torch.tensor(lengths), batch_first=module.batch_first,
                                   enforce_sorted=False)
    y, h = module(inp, hx)
    out = {}
    if lengths is not None:
        out["packed"] = y
        out["y"] = y.data
    else:
        out["y"] = y
    if is_lstm(module):
        out["hy"], out["cy"] = h
    else:
        out["hy"] = h
    g = torch.Generator().manual_seed(seed)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=t.dtype)).sum()
               for k, t in out.items() if k != "packed")
    module.zero_grad(set_to_none=True)
    loss.backward()
    out["dx"] = x.grad
    for i, leaf in enumerate(leaves[1:]):
        out[f"dh{i}"] = leaf.grad
    for name, p in module.named_parameters():
        out["grad " + name] = p.grad
    return out


def assert_same_results(got, want, dtype):
    assert got.keys() == want.keys()
    for key in want:
        if key == "packed":
            for field in ("batch_sizes", "sorted_indices", "unsorted_indices"):
                a, b = getattr(got[key], field), getattr(want[key], field)
                assert (a is None and b is None) or torch.equal(a, b), field
            continue
        assert_close(got[key], want[key], dtype, key)


# --- 1. the same results as torch.nn ---------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("with_hx", [False, True], ids=["no_hx", "hx"])
@pytest.mark.parametrize("mode", ["padded", "packed", "unbatched"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["tm", "bf"])
@pytest.mark.parametrize("L,bidir", [(1, False), (2, True), (3, False)], ids=["L1", "L2bi", "L3"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_matches_torch(kind, L, bidir, batch_first, mode, with_hx, dtype):
    ref, mine = pair(kind, dtype, num_layers=L, bidirectional=bidir, batch_first=batch_first)
    T, N = 6, 4
    x, hx = make_inputs(ref, T, N, dtype, batched=mode != "unbatched", with_hx=with_hx)
    lengths = [6, 2, 5, 1] if mode == "packed" else None
    assert_same_results(run(mine, x, hx, lengths), run(ref, x, hx, lengths), dtype)


@pytest.mark.parametrize("kind", ["gru", "lstm_proj"])
def test_packed_sorted_and_padded_output(kind):
    """enforce_sorted=True (no indices), and the padded output pad_packed_sequence makes."""
    ref, mine = pair(kind, num_layers=2, bidirectional=True)
    x, hx = make_inputs(ref, 5, 3, torch.float64)
    packed = pack_padded_sequence(x, torch.tensor([5, 3, 2]))
    (y1, h1), (y2, h2) = ref(packed, hx), mine(packed, hx)
    assert y2.sorted_indices is None and torch.equal(y1.batch_sizes, y2.batch_sizes)
    assert_close(pad_packed_sequence(y2)[0], pad_packed_sequence(y1)[0], torch.float64, "y")
    for a, b in zip(h2 if is_lstm(ref) else [h2], h1 if is_lstm(ref) else [h1]):
        assert_close(a, b, torch.float64, "hy")


def test_bias_false():
    for kind in KINDS:
        ref, mine = pair(kind, bias=False, num_layers=2)
        assert [n for n, _ in mine.named_parameters()] == [n for n, _ in ref.named_parameters()]
        x, hx = make_inputs(ref, 5, 3, torch.float64)
        assert_same_results(run(mine, x, hx), run(ref, x, hx), torch.float64)


def test_same_init_and_names_as_torch():
    for kind, (theirs, ours, extra) in KINDS.items():
        kw = dict(num_layers=2, bidirectional=True, **extra)
        torch.manual_seed(7)
        ref = theirs(I, H, **kw)
        torch.manual_seed(7)
        mine = ours(I, H, **kw)
        assert isinstance(mine, theirs)
        assert list(mine.state_dict()) == list(ref.state_dict())
        for (n1, p1), (n2, p2) in zip(mine.named_parameters(), ref.named_parameters()):
            assert n1 == n2 and torch.equal(p1, p2), n1
        assert repr(mine) == repr(ref)
        assert mine._flat_weights_names == ref._flat_weights_names


def test_no_grad_and_inference_mode(monkeypatch):
    """Without grad cgru runs its inference forward (no reserve); with grad its training one."""
    ref, mine = pair("gru", num_layers=2)
    x, hx = make_inputs(ref, 5, 3, torch.float64)
    from cgru.core import engine
    seen, real, real_repeat = [], engine.run_forward, engine.repeat

    def recording_forward(call, *args, **kw):
        seen.append(call.training)
        return real(call, *args, **kw)

    def recording_repeat(*args):        # a repeated inference that went straight to its runner
        done = real_repeat(*args)
        if done is not None:
            seen.append(False)
        return done

    monkeypatch.setattr(engine, "run_forward", recording_forward)
    monkeypatch.setattr(engine, "repeat", recording_repeat)
    want, _ = ref(x, hx)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            y, h = mine(x, hx)
        assert y.grad_fn is None and not y.requires_grad
        assert_close(y, want.detach(), torch.float64, "y")
    y, _ = mine(x, hx)
    assert y.grad_fn is not None
    mine.eval()
    for p in mine.parameters():
        p.requires_grad_(False)
    y, _ = mine(x, hx)                          # nothing requires grad: inference forward
    assert y.grad_fn is None
    assert seen == [False, False, True, False]


def test_needs_input_grad():
    """Only what requires grad gets a gradient (frozen weights get none), and it is right."""
    ref, mine = pair("lstm", num_layers=2)
    x, (h, c) = make_inputs(ref, 5, 3, torch.float64)
    for m in (ref, mine):
        for p in m.parameters():
            p.requires_grad_(False)
        m.bias_hh_l1.requires_grad_(True)
    got, want = [], []
    for m, out in ((mine, got), (ref, want)):
        xg, hg = x.clone().requires_grad_(), h.clone().requires_grad_()
        y, (hy, cy) = m(xg, (hg, c))
        (y.sum() + cy.sum()).backward()
        assert [n for n, p in m.named_parameters() if p.grad is not None] == ["bias_hh_l1"]
        out += [xg.grad, hg.grad, m.bias_hh_l1.grad]
    for a, b, what in zip(got, want, ("dx", "dh0", "dbias_hh_l1")):
        assert_close(a, b, torch.float64, what)
    xg = x.clone().requires_grad_()             # only x: no parameter gradient at all
    mine.bias_hh_l1.requires_grad_(False)
    mine.bias_hh_l1.grad = None
    mine(xg)[0].sum().backward()
    assert xg.grad is not None and all(p.grad is None for p in mine.parameters())


def test_unused_outputs_and_retain_graph():
    """Gradients of only hy (y unused), and a second backward on a retained graph."""
    ref, mine = pair("gru", num_layers=2, bidirectional=True)
    x, _ = make_inputs(ref, 5, 3, torch.float64)
    grads = []
    for m in (mine, ref):
        xg = x.clone().requires_grad_()
        _, hy = m(xg)
        hy.sum().backward(retain_graph=True)
        first = xg.grad.clone()
        hy.sum().backward()
        assert_close(xg.grad, 2 * first, torch.float64, "dx twice")
        grads.append(first)
    assert_close(grads[0], grads[1], torch.float64, "dx")


def test_functional_call_and_pickle():
    ref, mine = pair("lstm_proj", num_layers=2, bidirectional=True)
    x, hx = make_inputs(ref, 5, 3, torch.float64)
    params = {n: torch.randn_like(p) for n, p in ref.named_parameters()}
    want = functional_call(ref, params, (x, hx))[0]
    assert_close(functional_call(mine, params, (x, hx))[0], want, torch.float64, "y")
    buf = io.BytesIO()
    torch.save(mine, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded) is ct.LSTM
    assert_close(loaded(x, hx)[0], mine(x, hx)[0], torch.float64, "pickled y")
    assert_close(copy.deepcopy(mine)(x, hx)[0], mine(x, hx)[0], torch.float64, "deepcopy y")
    mine.flatten_parameters()                   # a no-op on the CPU, as torch's


# --- 2. gradcheck ----------------------------------------------------------------------------
GRADCHECK_CASES = [
    ("gru", dict(num_layers=2, bidirectional=True), "packed"),
    ("gru", dict(batch_first=True), "padded"),
    ("lstm", dict(num_layers=2, bidirectional=True), "packed"),
    ("lstm_proj", dict(num_layers=2, bidirectional=True, batch_first=True), "padded"),
    ("lstm_proj", dict(), "unbatched"),
    ("rnn_tanh", dict(num_layers=2, bidirectional=True), "packed"),
    ("rnn_relu", dict(num_layers=2), "padded"),
]


@pytest.mark.parametrize("kind,kw,mode", GRADCHECK_CASES,
                         ids=[f"{k}-{m}-{i}" for i, (k, _, m) in enumerate(GRADCHECK_CASES)])
def test_gradcheck(kind, kw, mode):
    _, mine = pair(kind, **kw)
    x, hx = make_inputs(mine, 4, 3, torch.float64, batched=mode != "unbatched")
    names = [n for n, _ in mine.named_parameters()]
    lstm = is_lstm(mine)
    states = list(hx) if lstm else [hx]

    def f(x, *rest):
        hs, ws = rest[:len(states)], rest[len(states):]
        inp = x
        if mode == "packed":
            inp = pack_padded_sequence(x, torch.tensor([2, 4, 3]), enforce_sorted=False)
        y, h = functional_call(mine, dict(zip(names, ws)), (inp, tuple(hs) if lstm else hs[0]))
        return (y.data if mode == "packed" else y, *(h if lstm else [h]))

    leaves = [t.detach().clone().requires_grad_() for t in
              [x, *states, *mine.parameters()]]
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-8, rtol=1e-6)


def test_gradcheck_with_dropout():
    """The same seed gives the same masks: finite differences see one function."""
    _, mine = pair("gru", num_layers=3, dropout=0.4)
    x, h = make_inputs(mine, 4, 3, torch.float64)
    names = [n for n, _ in mine.named_parameters()]

    def f(x, h, *ws):
        torch.manual_seed(5)
        return functional_call(mine, dict(zip(names, ws)), (x, h))

    leaves = [t.detach().clone().requires_grad_() for t in [x, h, *mine.parameters()]]
    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-8, rtol=1e-6)


# --- 3. state_dict, swap, training -----------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
def test_state_dict_round_trip(kind):
    theirs, ours, extra = KINDS[kind]
    kw = dict(num_layers=2, bidirectional=True, **extra)
    torch.manual_seed(3)
    trained = theirs(I, H, **kw)
    mine = ours(I, H, **kw)
    mine.load_state_dict(trained.state_dict())          # torch -> cgru
    back = theirs(I, H, **kw)
    back.load_state_dict(mine.state_dict())             # cgru -> torch
    for (k1, v1), (k2, v2) in zip(trained.state_dict().items(), back.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2), k1
    x, hx = make_inputs(trained, 5, 3, torch.float32)
    assert_close(mine(x, hx)[0], trained(x, hx)[0], torch.float32, "y")


class Tagger(nn.Module):
    """Embedding → bidirectional 2-layer GRU → Linear."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 6)
        self.rnn = nn.GRU(6, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Sequential(nn.Linear(16, 3))

    def forward(self, tokens):
        y, _ = self.rnn(self.emb(tokens))
        return self.head(y)


def tokens(seed=0, N=4, T=7):
    return torch.randint(0, 20, (N, T), generator=torch.Generator().manual_seed(seed))


def test_swap_keeps_parameters_and_outputs():
    torch.manual_seed(0)
    model = Tagger().double()
    model.extra = nn.ModuleList([nn.LSTM(3, 4, proj_size=2), nn.RNN(3, 4, nonlinearity="relu")])
    params = list(model.parameters())
    want = model(tokens())
    assert ct.swap(model) is model
    assert type(model.rnn) is ct.GRU and isinstance(model.rnn, nn.GRU)
    assert type(model.extra[0]) is ct.LSTM and type(model.extra[1]) is ct.RNN
    assert all(a is b for a, b in zip(model.parameters(), params))     # the same tensors
    assert_close(model(tokens()), want, torch.float64, "model output")


def test_swap_module_itself_and_subclasses():
    class MyGRU(nn.GRU):
        pass

    gru, mine = nn.GRU(3, 4), MyGRU(3, 4)
    assert type(ct.swap(gru)) is ct.GRU
    with pytest.warns(UserWarning, match="left as they are: MyGRU"):
        assert type(ct.swap(mine)) is MyGRU             # user subclasses are left alone
    with pytest.raises(TypeError, match="model"):
        ct.swap(gru.state_dict())


@pytest.mark.parametrize("optimizer", [
    lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9),
    lambda params: torch.optim.Adam(params, lr=0.05)], ids=["SGD", "Adam"])
def test_training_reaches_the_same_weights(optimizer):
    torch.manual_seed(0)
    ref = Tagger().double()
    mine = ct.swap(copy.deepcopy(ref))
    targets = torch.randint(0, 3, (4, 7), generator=torch.Generator().manual_seed(1))
    for model in (ref, mine):
        opt = optimizer(model.parameters())
        for step in range(5):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(tokens(step)).reshape(-1, 3),
                                               targets.reshape(-1))
            loss.backward()
            opt.step()
    for (name, a), (_, b) in zip(mine.named_parameters(), ref.named_parameters()):
        assert_close(a.detach(), b.detach(), torch.float64, name)
    assert not torch.equal(ref.rnn.weight_hh_l0, Tagger().double().rnn.weight_hh_l0)


@pytest.mark.parametrize("cls", [ct.GRU, ct.LSTM, ct.RNN])
def test_a_training_loop_leaves_no_cyclic_garbage(cls):
    """An optimizer's steps (weights changed in place every step) leave nothing for the cyclic
    garbage collector: each step's copies, packs and autograd state are freed by reference
    counting as the next step replaces them (a GRU of 768×256 weights held 90 MiB more at its
    peak when they waited for the collector)."""
    import gc
    model = cls(8, 16, num_layers=2, bidirectional=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.ones(3, 2, 8)

    def step():
        opt.zero_grad()
        y, _ = model(x)
        y.sum().backward()
        opt.step()

    step()
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            step()
        assert gc.collect() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_what_needs_no_gradient_gets_none_computed(kind, monkeypatch):
    """Data that needs no gradient (the usual first input): cgru's backward is asked for no
    ``dx`` — the first layer's input-gradient product is not computed —, frozen weights for
    no weight gradients; what is asked for equals torch's."""
    from cgru.core import calls
    asked = []
    check = calls.BackwardCall.check.__func__

    def recorded(cls, *a, **k):
        asked.append((k.get("need_dx", True), k.get("need_dparams", True)))
        return check(cls, *a, **k)
    monkeypatch.setattr(calls.BackwardCall, "check", classmethod(recorded))
    ref, mine = pair(kind, dtype=torch.float64, num_layers=2, bidirectional=True)
    for x_needs, weights_need in ((False, True), (True, True), (True, False)):
        for model in (ref, mine):
            model.requires_grad_(weights_need)
        x, hx = make_inputs(ref, 5, 3, torch.float64)
        x.requires_grad_(x_needs)
        wrt = ([x] if x_needs else []) + (list(mine.parameters()) if weights_need else [])
        got = torch.autograd.grad(mine(x, hx)[0].square().sum(), wrt)
        wrt = ([x] if x_needs else []) + (list(ref.parameters()) if weights_need else [])
        want = torch.autograd.grad(ref(x, hx)[0].square().sum(), wrt)
        assert asked[-1] == (x_needs, weights_need)
        names = (["x"] if x_needs else []) + \
            ([n for n, _ in ref.named_parameters()] if weights_need else [])
        for a, b, what in zip(got, want, names):
            assert_close(a, b, torch.float64, what)


def test_calls_of_a_module_share_what_cgru_made_for_its_weights(monkeypatch):
    # The second training step of a module makes nothing again for its unchanged weights (no
    # new network view, no new Frozen: plans, packs and the kernels' arguments are the first
    # step's) and binds no arguments through inspect — yet the weights are proven by their
    # bytes in every call: a write through .data (no version bump) is seen.
    from cgru.core import weights as weights_mod
    ref, mine = pair("gru", dtype=torch.float64, num_layers=2)
    x, hx = make_inputs(ref, 5, 3, torch.float64)

    def step(model):
        y, hy = model(x, hx)
        return y, hy, torch.autograd.grad((y * y).sum() + hy.sum(), list(model.parameters()))

    step(mine)
    made = {"frozen": 0, "network": 0, "signature": 0}
    for name, target in (("frozen", weights_mod.Frozen), ("network", cgru.Network)):
        init = target.__init__

        def counted(self, *a, _init=init, _name=name, **k):
            made[_name] += 1
            _init(self, *a, **k)
        monkeypatch.setattr(target, "__init__", counted)
    signature = torch.autograd.function.inspect.signature

    def counted_signature(*a, **k):
        made["signature"] += 1
        return signature(*a, **k)
    monkeypatch.setattr(torch.autograd.function.inspect, "signature", counted_signature)
    got = step(mine)
    assert made == {"frozen": 0, "network": 0, "signature": 0}
    want = step(ref)
    for a, b, what in zip(got[:2] + tuple(got[2]), want[:2] + tuple(want[2]),
                          ["y", "hy"] + [n for n, _ in ref.named_parameters()]):
        assert_close(a, b, torch.float64, what)
    with torch.no_grad():
        for model in (mine, ref):
            model.weight_hh_l1.data.mul_(0.5)           # .data: the version stays
    got, want = step(mine), step(ref)
    assert made["frozen"] > 0                            # new bytes, a new kept copy
    for a, b, what in zip(got[:2] + tuple(got[2]), want[:2] + tuple(want[2]),
                          ["y", "hy"] + [n for n, _ in ref.named_parameters()]):
        assert_close(a, b, torch.float64, what + " after a write through .data")
    # an optimizer's in-place step (the version moves): the same network of views, new bytes
    frozen = made["frozen"]
    with torch.no_grad():
        for model in (mine, ref):
            for p in model.parameters():
                p.add_(0.01)
    got, want = step(mine), step(ref)
    assert made["network"] == 0 and made["frozen"] > frozen
    for a, b, what in zip(got[:2] + tuple(got[2]), want[:2] + tuple(want[2]),
                          ["y", "hy"] + [n for n, _ in ref.named_parameters()]):
        assert_close(a, b, torch.float64, what + " after an in-place step")
    monkeypatch.undo()
    # inside a torch.func transform, torch's own apply (with its binding) serves
    params = dict(mine.named_parameters())
    g = torch.func.grad(lambda p: functional_call(mine, p, (x, hx))[0].sum())(params)
    y0 = functional_call(ref, dict(ref.named_parameters()), (x, hx))[0].sum()
    want = torch.autograd.grad(y0, list(ref.parameters()))
    for (name, a), b in zip(g.items(), want):
        assert_close(a, b, torch.float64, "torch.func.grad " + name)


def test_the_backward_differentiates_what_its_forward_computed():
    # A write through .data between forward and backward (torch's version check cannot see
    # it) changes nothing: the gradients are those of the function the forward computed.
    ref, mine = pair("lstm", dtype=torch.float64, proj_size=P)
    x, hx = make_inputs(ref, 4, 2, torch.float64)
    x.requires_grad_(True)
    want = torch.autograd.grad(ref(x, hx)[0].square().sum(), [x, *ref.parameters()])
    y, _ = mine(x, hx)
    with torch.no_grad():
        for p in mine.parameters():
            p.data.mul_(0.5)
    got = torch.autograd.grad(y.square().sum(), [x, *mine.parameters()])
    for a, b, what in zip(got, want, ["x"] + [n for n, _ in ref.named_parameters()]):
        assert_close(a, b, torch.float64, what)


def test_vmapped_weights_get_their_own_gradients():
    # vmap over the weights: one forward per entry on the same call, each with its weights
    ref, mine = pair("gru", dtype=torch.float64)
    x, hx = make_inputs(ref, 3, 2, torch.float64)
    scales = torch.tensor([1.0, 0.5, -0.25], dtype=torch.float64)

    def per_entry(model):
        params = {k: torch.stack([v.detach() * s for s in scales])
                  for k, v in model.named_parameters()}
        loss = lambda p: functional_call(model, p, (x, hx))[0].square().sum()   # noqa: E731
        return torch.func.vmap(torch.func.grad(loss))(params)

    got, want = per_entry(mine), per_entry(ref)
    for name in want:
        assert_close(got[name], want[name], torch.float64, name)


def test_a_deleted_module_leaves_nothing_behind():
    import gc
    import weakref
    mine = ct.GRU(I, H, dtype=torch.float64)
    mine(torch.randn(3, 2, I, dtype=torch.float64, requires_grad=True))[0].sum().backward()
    gone = weakref.ref(mine.weight_hh_l0)
    key = id(mine)
    assert key in ct._MODELS
    del mine
    gc.collect()
    assert gone() is None and key not in ct._MODELS


# --- 4. dropout ------------------------------------------------------------------------------
def test_dropout_reproducible_and_off_in_eval():
    ref, mine = pair("lstm", num_layers=3, dropout=0.5, bidirectional=True)
    x, hx = make_inputs(ref, 6, 4, torch.float64)
    torch.manual_seed(11)
    y1 = mine(x, hx)[0]
    torch.manual_seed(11)
    y2 = mine(x, hx)[0]
    y3 = mine(x, hx)[0]
    assert torch.equal(y1, y2) and not torch.equal(y1, y3)
    with torch.no_grad():                    # training mode: dropout on, as torch's
        torch.manual_seed(11)
        assert torch.equal(mine(x, hx)[0], y1)
    ref.eval(), mine.eval()
    assert_close(mine(x, hx)[0], ref(x, hx)[0], torch.float64, "eval y")


def test_dropout_masks_are_cgrus_seeded_by_torch():
    _, mine = pair("gru", num_layers=2, dropout=0.3)
    x, h = make_inputs(mine, 5, 3, torch.float64)
    torch.manual_seed(4)
    y = mine(x, h)[0]
    torch.manual_seed(4)
    s = torch.randint(-2 ** 63, 2 ** 63 - 1, (2,), dtype=torch.int64)
    net = cgru.Network(cgru.Topology(I, H, 2), [
        cgru.LayerParams(*(getattr(mine, f"{n}_l{l}").detach().numpy()
                           for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")))
        for l in range(2)], cgru.GRUCell())
    want = cgru.forward(net, x.numpy(), h.numpy(), training=True, dropout=0.3,
                        seed=(int(s[0]), int(s[1]))).y
    np.testing.assert_array_equal(y.detach().numpy(), want)


def test_no_dropout_with_one_layer_consumes_no_rng():
    with pytest.warns(UserWarning):
        _, mine = pair("gru", num_layers=1, dropout=0.5)
    x, _ = make_inputs(mine, 4, 2, torch.float64)
    torch.manual_seed(0)
    mine(x)
    after_forward = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after_forward, torch.rand(3))


# --- 5. errors -------------------------------------------------------------------------------
# torch's own words for an input whose dtype is not the weights' (a ValueError in torch too)
MISMATCH = (r"RNN input dtype \({}\) does not match weight dtype \(torch.float32\). "
            r"Convert input: input.to\(torch.float32\), or convert model: model.to\(")


def test_errors_name_the_argument():
    gru = ct.GRU(I, H, num_layers=2)
    lstm = ct.LSTM(I, H, proj_size=P)
    x = torch.randn(5, 3, I)
    cases = [
        (TypeError, "input: expected a torch.Tensor", lambda: gru(x.numpy())),
        (ValueError, "input: cgru.torch computes on the CPU", lambda: gru(x.to("meta"))),
        (ValueError, MISMATCH.format("torch.float64"), lambda: gru(x.double())),
        (ValueError, MISMATCH.format("torch.float16"), lambda: gru(x.half())),
        (ValueError, MISMATCH.format("torch.bfloat16"), lambda: gru(x.bfloat16())),
        (ValueError, MISMATCH.format("torch.int64"), lambda: gru(x.long())),
        (ValueError, "input.data: " + MISMATCH.format("torch.float64"),
         lambda: gru(pack_padded_sequence(x.double(), torch.tensor([5, 4, 1])))),
        (TypeError, "input: expected a dense", lambda: gru(x.to_sparse())),
        (ValueError, "input: expected a 3-D tensor", lambda: gru(x[None])),
        (ValueError, "input: expected shape", lambda: gru(torch.randn(5, 3, I + 1))),
        (ValueError, "input: expected shape .* and T ≥ 1", lambda: gru(torch.randn(0, 3, I))),
        (ValueError, r"hx: expected shape \[L·D=2, N=3, H=5\]",
         lambda: gru(x, torch.zeros(1, 3, H))),
        (ValueError, r"hx: expected shape", lambda: gru(x, torch.zeros(2, 3))),
        (ValueError, r"hx \(unbatched input\): expected shape",
         lambda: gru(x[:, 0], torch.zeros(2, 1, H))),
        (ValueError, "hx: expected dtype torch.float32",
         lambda: gru(x, torch.zeros(2, 3, H, dtype=torch.float64))),
        (TypeError, "hx: expected a torch.Tensor", lambda: gru(x, [1.0])),
        (TypeError, r"hx: expected a \(h_0, c_0\) tuple", lambda: lstm(x, torch.zeros(1, 3, P))),
        (ValueError, r"hx\[0\] \(h_0\): expected shape \[L·D=1, N=3, proj_size=3\]",
         lambda: lstm(x, (torch.zeros(1, 3, H), torch.zeros(1, 3, H)))),
        (ValueError, r"hx\[1\] \(c_0\): expected shape \[L·D=1, N=3, H=5\]",
         lambda: lstm(x, (torch.zeros(1, 3, P), torch.zeros(1, 3, P)))),
        (ValueError, r"hx\[1\] \(c_0\): expected dtype",
         lambda: lstm(x, (torch.zeros(1, 3, P), torch.zeros(1, 3, H).double()))),
        (ValueError, "input.data: expected a packed 2-D tensor",
         lambda: gru(pack_padded_sequence(torch.randn(5, 3, I + 1), torch.tensor([5, 4, 1])))),
    ]
    for exc, message, call in cases:
        with pytest.raises(exc, match=message):
            call()


def test_module_errors():
    half = ct.GRU(I, H).half()
    with pytest.raises(TypeError, match="weight_ih_l0: expected dtype torch.float32 or"):
        half(torch.randn(5, 3, I).half())
    meta = ct.GRU(I, H, device="meta")
    with pytest.raises(ValueError, match="weight_ih_l0: cgru.torch computes on the CPU"):
        meta(torch.randn(5, 3, I))
    mixed = ct.GRU(I, H)
    mixed.bias_hh_l0.data = mixed.bias_hh_l0.data.double()
    with pytest.raises(ValueError, match="bias_hh_l0: expected dtype torch.float32"):
        mixed(torch.randn(5, 3, I))
    full = ct.GRU(I, H, num_layers=2, dropout=1.0)
    with pytest.raises(ValueError, match="dropout"):
        full(torch.randn(5, 3, I))
    full.eval()
    full(torch.randn(5, 3, I))                  # eval: no dropout, fine


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (the meta device "
                    "stands in for other devices in test_errors_name_the_argument)")
def test_cuda_tensors_refused():
    with pytest.raises(ValueError, match="input: cgru.torch computes on the CPU"):
        ct.GRU(I, H)(torch.randn(5, 3, I, device="cuda"))
    with pytest.raises(ValueError, match="weight_ih_l0: cgru.torch computes on the CPU"):
        ct.GRU(I, H).cuda()(torch.randn(5, 3, I, device="cuda"))


@pytest.mark.parametrize("wrt", ["x", "h0", "weight_hh_l0"])
@pytest.mark.parametrize("upstream", ["depends on the output", "constant"])
def test_double_backward_refused(upstream, wrt):
    """A create_graph=True backward gives the first-order gradients (torch.func.grad always
    asks for one), and they are part of the graph: differentiating them again — a gradient
    penalty — raises, also with a constant upstream gradient and when only ``h_0`` requires
    grad (a gradient used to come back detached there, so the penalty silently dropped out
    of the loss: weight_hh's gradient 0.065 against 2.40 with nn.GRU)."""
    ref, mine = pair("gru")
    x = torch.randn(3, 2, I, dtype=torch.float64, requires_grad=wrt == "x")
    h0 = torch.randn(1, 2, H, dtype=torch.float64, requires_grad=wrt == "h0")
    for m in (ref, mine):
        for name, p in m.named_parameters():
            p.requires_grad_(name == wrt)
    grads = []
    for m in (mine, ref):
        leaf = {"x": x, "h0": h0}.get(wrt)
        leaf = getattr(m, wrt) if leaf is None else leaf
        y = m(x, h0)[0]
        loss = y.pow(2).sum() if upstream == "depends on the output" else y.sum()
        (g,) = torch.autograd.grad(loss, leaf, create_graph=True)
        grads.append(g)
        if m is mine:
            assert g.requires_grad, "the gradient must stay in the graph"
            with pytest.raises(RuntimeError, match="double backward is not supported"):
                g.pow(2).sum().backward()
    assert_close(grads[0].detach(), grads[1].detach(), torch.float64, f"d{wrt}")
    leaf = {"x": x, "h0": h0}.get(wrt)
    leaf = mine.weight_hh_l0 if leaf is None else leaf
    (g,) = torch.autograd.grad(mine(x, h0)[0].sum(), leaf)
    assert not g.requires_grad                 # without create_graph: a plain gradient


# --- 6. torch.func, batched gradients, compilers, empty batches --------------------------------
def _func_pair(kind="lstm_proj"):
    return pair(kind, num_layers=2, bidirectional=True)


def _stack(results):
    return {k: torch.stack([r[k] for r in results]) for k in results[0]}


@pytest.mark.parametrize("kind", list(KINDS))
def test_torch_func_grad_and_per_sample_vmap(kind):
    """torch.func.grad of a loss over the parameters, and vmap(grad) for per-sample
    gradients, against torch's module (per sample in a loop: nn.GRU itself fails under
    vmap(grad) in torch 2.13)."""
    ref, mine = _func_pair(kind)
    xs = torch.randn(3, 4, 2, I, dtype=torch.float64)       # 3 samples of [T=4, N=2, I]
    params = {n: p.detach() for n, p in ref.named_parameters()}

    def loss(p, m, x):
        y, h = functional_call(m, p, (x,))
        return y.pow(2).sum() + (h[0] if is_lstm(m) else h).sum()

    want = [torch.func.grad(loss)(params, ref, x) for x in xs]
    got = torch.func.grad(loss)(params, mine, xs[0])
    for name in params:
        assert_close(got[name], want[0][name], torch.float64, f"grad {name}")
    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, None, 0))(
        params, mine, xs)
    want = _stack(want)
    for name in params:
        assert_close(per_sample[name], want[name], torch.float64, f"per-sample {name}")


def test_torch_func_vmap_forward_and_jacrev():
    ref, mine = _func_pair("gru")
    xs = torch.randn(3, 4, 2, I, dtype=torch.float64)
    got = torch.func.vmap(lambda x: mine(x)[0])(xs)
    assert_close(got, torch.stack([ref(x)[0] for x in xs]).detach(), torch.float64, "vmap y")
    jac = torch.func.jacrev(lambda x: mine(x)[1])(xs[0])
    want = torch.autograd.functional.jacobian(lambda x: ref(x)[1], xs[0])
    assert jac.shape == (4, 2, H, 4, 2, I)
    assert_close(jac, want, torch.float64, "jacrev")
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.func.grad(lambda x: torch.func.grad(lambda x: mine(x)[0].pow(2).sum())(x)
                        .sum())(xs[0])


@pytest.mark.parametrize("kind", list(KINDS))
def test_gradcheck_batched_gradients(kind):
    """gradcheck's batched-gradient check (a vmap over the backward, as torch's own tests
    run it), for the input, the initial states and every parameter."""
    _, mine = pair(kind, num_layers=2, bidirectional=True)
    x, hx = make_inputs(mine, 3, 2, torch.float64)
    names = [n for n, _ in mine.named_parameters()]
    states = list(hx) if is_lstm(mine) else [hx]

    def f(x, *rest):
        hs, ws = rest[:len(states)], rest[len(states):]
        y, h = functional_call(mine, dict(zip(names, ws)),
                               (x, tuple(hs) if is_lstm(mine) else hs[0]))
        return (y, *(h if is_lstm(mine) else [h]))

    leaves = [t.detach().clone().requires_grad_() for t in [x, *states, *mine.parameters()]]
    assert torch.autograd.gradcheck(f, leaves, check_batched_grad=True, fast_mode=True)


def test_torchscript_refused_torch_compile_works():
    model = ct.swap(Tagger().double())
    tokens = torch.randint(0, 20, (4, 7))
    with pytest.raises(RuntimeError, match=r"torch.jit.script .* Use torch.compile\(model\)"):
        torch.jit.script(model)
    with pytest.raises(RuntimeError, match=r"torch.jit.trace .* Use torch.compile\(model\)"):
        torch.jit.trace(model, (tokens,))
    ref = Tagger().double()
    ref.load_state_dict(model.state_dict())
    compiled = torch.compile(model)
    for _ in range(2):
        assert_close(compiled(tokens), ref(tokens).detach(), torch.float64, "compiled")
    compiled(tokens).sum().backward()
    ref(tokens).sum().backward()
    for (name, a), (_, b) in zip(model.named_parameters(), ref.named_parameters()):
        assert_close(a.grad, b.grad, torch.float64, f"compiled grad {name}")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("batch_first", [False, True], ids=["tm", "bf"])
def test_empty_batch(kind, batch_first):
    """N = 0: empty outputs of torch's shapes, and zero weight gradients, as torch."""
    ref, mine = pair(kind, num_layers=2, bidirectional=True, batch_first=batch_first)
    x, hx = make_inputs(ref, 4, 0, torch.float64)
    for with_hx in (False, True):
        got = run(mine, x, hx if with_hx else None)
        want = run(ref, x, hx if with_hx else None)
        assert_same_results(got, want, torch.float64)
        assert got["y"].shape == want["y"].shape and got["y"].numel() == 0


def test_swap_warns_when_nothing_to_swap():
    cells = nn.Sequential(nn.GRUCell(I, H), nn.LSTMCell(H, H))
    with pytest.warns(UserWarning, match="no torch.nn.GRU, LSTM or RNN to swap; left as they "
                                         "are: GRUCell, LSTMCell"):
        assert ct.swap(cells) is cells
    assert type(cells[0]) is nn.GRUCell

    class Mine(nn.GRU):
        pass

    with pytest.warns(UserWarning, match="left as they are: Mine"):
        ct.swap(nn.Sequential(Mine(I, H)))
    with pytest.warns(UserWarning, match="Linear has no torch.nn.GRU"):
        ct.swap(nn.Linear(2, 2))
    swapped = ct.swap(Tagger())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ct.swap(swapped)                       # already on cgru: nothing to say
        ct.swap(Tagger())


# --- 7. import hygiene -----------------------------------------------------------------------
def test_import_cgru_does_not_import_torch():
    code = ("import sys, cgru; cgru.forward; "
            "assert 'cgru.torch' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_clear_import_error_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import cgru.torch\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                         capture_output=True, text=True).stdout
    assert "cgru.torch needs PyTorch" in out


def test_a_process_exits_quietly_when_its_weights_outlive_cgru():
    # A timing wrapper put in cgru's namespace holds the script's globals — the module and
    # its parameters — until the interpreter tears cgru down at exit: the kept copy's watch
    # on a parameter (and a pooled block's finalizer) then fires after the module globals
    # it uses are gone.  It must go quietly, not print "Exception ignored" tracebacks.
    code = ("import torch, cgru, cgru.torch\n"
            "m = cgru.torch.GRU(8, 8)\n"
            "inner = cgru.forward\n"
            "def timed(*a, **k):\n"
            "    return inner(*a, **k)\n"
            "cgru.forward = timed\n"
            "m(torch.randn(2, 1, 8))\n")
    run = subprocess.run([sys.executable, "-c", code], timeout=120, capture_output=True,
                         text=True)
    assert run.returncode == 0 and run.stderr == "", run.stderr[-2000:]


def test_repeated_inference_goes_straight_to_the_runner_and_sees_every_weight_change(
        monkeypatch):
    """A module's repeated inference calls of one shape skip the general path's checks
    (counted) and compare the weights' bytes with the copies the runner computes from, every
    call: a change through an optimizer-style in-place step, through ``.data`` and through a
    NumPy view (the two torch's version counter does not see) is computed with on the next
    call, as is a parameter replaced by another tensor; each result equals torch's module's."""
    from cgru.core import calls
    checks = []
    real = calls.ForwardCall.check
    monkeypatch.setattr(calls.ForwardCall, "check",
                        classmethod(lambda cls, *a, **k: checks.append(1) or real(*a, **k)))
    ref, mine = pair("lstm", torch.float32, num_layers=2)
    x, hx = make_inputs(ref, 4, 3, torch.float32)

    def both():
        with torch.no_grad():
            ref.load_state_dict(mine.state_dict())
            want, (hw, cw) = ref(x, hx)
            y, (h, c) = mine(x, hx)
        assert_close(y, want, torch.float32, "y")
        assert_close(h, hw, torch.float32, "h")
        assert_close(c, cw, torch.float32, "c")
        return y

    for _ in range(3):
        both()
    n = len(checks)
    before = both()
    assert len(checks) == n, "a repeated inference took the general path"
    w = mine.weight_hh_l1
    changes = [lambda: w.add_(0.5),                       # in place, as an optimizer steps
               lambda: w.data.mul_(0.5),                  # through .data: no new version
               lambda: w.detach().numpy().__setitem__((0, 0), 3.0)]   # NumPy: none either
    for change in changes:
        with torch.no_grad():
            change()
        y = both()
        assert not torch.equal(y, before), "a changed weight was not computed with"
        before = y
        both()
    mine.weight_ih_l0 = nn.Parameter(mine.weight_ih_l0.detach() * 2)
    assert not torch.equal(both(), before)
