"""``cgru.torch`` as PyTorch's own module tests see it.

PyTorch describes each of its modules for its test suite by a ``ModuleInfo``
(``torch.testing._internal.common_modules.module_db``): the constructor arguments and inputs
of its samples (for ``nn.GRU``, ``nn.LSTM`` and ``nn.RNN``: every ``bias``, ``batch_first``,
``bidirectional``, ``nonlinearity``, ``proj_size``, unbatched inputs with and without
``hx``), a reference function, and the errors it must raise.  PyTorch's ``test/test_modules.py``
runs generic checks over those samples; this file runs the same checks, on the CPU, against
cgru's modules, and adds the independent oracle: every output and gradient equals torch's own
module's with the same weights.

The checks, as ``test_modules.py`` names them: ``forward`` (the reference function, torch's
module, ``.float()``/``.double()``), ``factory_kwargs``, ``repr``, ``pickle``,
``non_contiguous_tensors``, ``grad`` (``gradcheck`` with batched gradients, total and per
parameter), ``gradgrad`` (refused: cgru's backward is not differentiable — the refusal is the
test), ``memory_format``, ``if_train_and_eval_modes_differ``, ``device_ctx_init`` and
``errors``.  Needs torch and expecttest (which torch's testing helpers import).
"""
import io
import zlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")

from torch import nn  # noqa: E402
from torch.testing._internal.common_modules import ModuleErrorEnum, module_db  # noqa: E402
from torch.testing._internal.common_utils import (  # noqa: E402
    freeze_rng_state, gradcheck, gradgradcheck)
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten  # noqa: E402

import cgru.torch as ct  # noqa: E402

CGRU = {nn.GRU: ct.GRU, nn.LSTM: ct.LSTM, nn.RNN: ct.RNN}
INFOS = [info for info in module_db if info.module_cls in CGRU]
DTYPES = [torch.float32, torch.float64]


@pytest.fixture(autouse=True)
def _seeded(request):
    """torch's global generator (the modules' initial weights and the samples' inputs) seeded
    by the test's name, as torch's own tests seed theirs: a test draws the same values
    whichever worker runs it and in whatever order, so a failure reproduces."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def cases(dtypes=DTYPES, trainings=(False, True)):
    return [pytest.param(info, dtype, training,
                         id=f"{info.name}-{str(dtype)[6:]}-{'train' if training else 'eval'}")
            for info in INFOS for dtype in dtypes for training in trainings]


def samples(info, dtype, training, requires_grad=False):
    return [s for s in info.module_inputs_func(info, device="cpu", dtype=dtype,
                                               requires_grad=requires_grad, training=training)
            if s.forward_input is not None]


def build(info, sample, dtype, training):
    """``(cgru module, torch module)`` of ``sample``'s constructor, the same weights."""
    args, kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
    mine = CGRU[info.module_cls](*args, **kwargs).to(dtype).train(training)
    theirs = info.module_cls(*args, **kwargs).to(dtype).train(training)
    theirs.load_state_dict(mine.state_dict())
    return mine, theirs


def fresh(obj):
    """A detached copy of every tensor in ``obj``, ``requires_grad`` kept."""
    return tree_map(lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                    if isinstance(t, torch.Tensor) else t, obj)


def tensors(obj):
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def close(got, want, what, dtype):
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    for a, b in zip(tensors(got), tensors(want), strict=True):
        torch.testing.assert_close(a, b, **tol, msg=lambda m: f"{what}: {m}")


def outputs_and_grads(module, args, seed=0, loss_dtype=None):
    """The outputs of ``module(*args)`` and the gradients of a fixed random linear function
    of them with respect to every input and parameter that requires grad (its weights drawn
    in ``loss_dtype``, the outputs' own by default)."""
    args = fresh(args)
    out = module(*args)
    flat = tensors(out)
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(t.shape, generator=g, dtype=loss_dtype or t.dtype).to(t.dtype)
               for t in flat]
    leaves = [t for t in tensors(args) if t.requires_grad] + \
        [p for p in module.parameters() if p.requires_grad]
    loss = sum((t * w).sum() for t, w in zip(flat, weights))
    return out, torch.autograd.grad(loss, leaves) if leaves else ()


# --- forward ---------------------------------------------------------------------------------
@pytest.mark.parametrize("info,dtype,training", cases())
def test_forward(info, dtype, training):
    for sample in samples(info, dtype, training):
        with freeze_rng_state():
            mine, theirs = build(info, sample, dtype, training)
            args, kwargs = sample.forward_input.args, sample.forward_input.kwargs
            out = mine(*args, **kwargs)
            close(out, sample.reference_fn(mine, *args, **kwargs),
                  "the ModuleInfo reference", dtype)
            close(out, theirs(*args, **kwargs), f"torch's {info.name}", dtype)
            {torch.float32: mine.float, torch.float64: mine.double}[dtype]()
            close(mine(*args, **kwargs), out, "after .float()/.double()", dtype)
            assert all(p.dtype == dtype for p in mine.parameters())


@pytest.mark.parametrize("info,dtype,training", cases())
def test_factory_kwargs(info, dtype, training):
    for sample in samples(info, dtype, training):
        kwargs = dict(sample.constructor_input.kwargs, device="cpu", dtype=dtype)
        m = CGRU[info.module_cls](*sample.constructor_input.args, **kwargs).train(training)
        assert all(p.device.type == "cpu" and p.dtype == dtype for p in m.parameters())


@pytest.mark.parametrize("info,dtype,training", cases())
def test_repr(info, dtype, training):
    for sample in samples(info, dtype, training):
        mine, theirs = build(info, sample, dtype, training)
        assert repr(mine) == repr(theirs) and str(mine) == str(theirs)


@pytest.mark.parametrize("info,dtype,training", cases())
def test_pickle(info, dtype, training):
    for sample in samples(info, dtype, training):
        with freeze_rng_state():
            mine, _ = build(info, sample, dtype, training)
            args = sample.forward_input.args
            out = mine(*args)
            buf = io.BytesIO()
            torch.save(mine, buf)
            buf.seek(0)
            copy = torch.load(buf, weights_only=False)
            assert type(copy) is type(mine)
            close(copy(*args), out, "unpickled", dtype)


# --- gradients -------------------------------------------------------------------------------
def _non_contiguous(t):
    """``t`` with the same values in a strided layout (every other element of a doubled
    last dimension), as torch's test makes them."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        return t
    out = torch.repeat_interleave(t.detach(), 2, dim=-1)[..., ::2]
    assert not out.is_contiguous()
    return out.requires_grad_(t.requires_grad)


def in_float64(info, sample, module, args):
    """``outputs_and_grads`` of torch's own module with ``module``'s weights, every input and
    the loss's weights in float64: the exact answer a float32 result is measured against."""
    theirs = info.module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs)
    theirs = theirs.double().train(module.training)
    theirs.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
    return outputs_and_grads(theirs, tree_map(
        lambda t: t.detach().double().requires_grad_(t.requires_grad)
        if isinstance(t, torch.Tensor) else t, args), loss_dtype=torch.float32)


def close_to_exact(got, exact, what):
    """A float32 result against the float64 answer, tensor by tensor, within what float32
    sums lose: up to about 2e-5 of the tensor's largest value where terms cancel (as much
    for torch's own module, measured over 300 random samples of each module); an element
    near zero is judged against that scale, not its own size."""
    for a, b in zip(tensors(got), tensors(exact), strict=True):
        atol = 1e-4 * max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=atol,
                                   msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("info,dtype,training", cases())
def test_non_contiguous_tensors(info, dtype, training):
    """Non-contiguous inputs give the contiguous ones' outputs and gradients bit for bit, and
    those are torch's (float64) or the float64 answer's within float32's rounding (two
    float32 implementations differ by more than a fixed elementwise tolerance where a
    gradient's terms cancel)."""
    for sample in samples(info, dtype, training, requires_grad=True):
        mine, theirs = build(info, sample, dtype, training)
        args = sample.forward_input.args
        got = outputs_and_grads(mine, args)
        for a, b in zip(tensors(outputs_and_grads(mine, tree_map(_non_contiguous, args))),
                        tensors(got), strict=True):
            assert torch.equal(a, b), "non-contiguous inputs changed a result"
        if dtype == torch.float64:
            close(got, outputs_and_grads(theirs, args), "against torch", dtype)
        else:
            close_to_exact(got, in_float64(info, sample, mine, args), "against float64")


def _gradcheck_samples(info, training, check, partials):
    """torch's gradient test: ``check`` of the module's outputs with respect to the inputs
    and every parameter together and — for the samples ``partials(constructor kwargs,
    forward args)`` picks — with respect to the inputs and each parameter alone."""
    for sample in samples(info, torch.float64, training, requires_grad=True):
        mine, _ = build(info, sample, torch.float64, training)
        args = sample.forward_input.args
        params = tuple(mine.parameters())
        flat, spec = tree_flatten(args + params)

        def f(*leaves):
            new = tree_unflatten(list(leaves), spec)
            with freeze_rng_state():
                return tensors(mine(*new[:len(args)]))

        assert check(f, flat)
        if not partials(sample.constructor_input.kwargs, args):
            continue
        for p in params:
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
            assert check(f, tree_flatten(args + params)[0])
            p.requires_grad_(False)


def _every_weight_kind(kwargs, args):
    """The samples whose modules have every kind of weight (biases, a reverse direction, a
    projection where the module has one) and that are given ``hx``: where the partial
    derivatives are checked one parameter at a time.  torch checks them for every sample;
    here the total derivative covers the others (the per-parameter checks are 15–25
    gradchecks per sample, minutes per module on two cores)."""
    return (kwargs["bias"] and kwargs["bidirectional"] and kwargs.get("proj_size", 1) > 0
            and len(args) == 2)


@pytest.mark.parametrize("info,dtype,training", cases([torch.float64]))
def test_grad(info, dtype, training):
    """gradcheck as torch's tests call it: fast mode and batched gradients (a vmap over the
    backward) on."""
    _gradcheck_samples(info, training, gradcheck, _every_weight_kind)


@pytest.mark.parametrize("info,dtype,training", cases([torch.float64]))
def test_gradgrad_is_refused(info, dtype, training):
    """torch's ModuleInfo says these modules support double backward; cgru's do not, and
    say so instead of returning second derivatives without cgru's terms."""
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        _gradcheck_samples(info, training, gradgradcheck, _every_weight_kind)


@pytest.mark.parametrize("info,dtype,training", cases())
def test_memory_format(info, dtype, training):
    """``contiguous_format`` / ``preserve_format`` modules and inputs: the same outputs and
    gradients, contiguous outputs."""
    for sample in samples(info, dtype, training, requires_grad=True):
        mine, _ = build(info, sample, dtype, training)
        args = sample.forward_input.args
        want = outputs_and_grads(mine, args)
        for module_format in (torch.preserve_format, torch.contiguous_format):
            mine.to(memory_format=module_format)
            inputs = tree_map(lambda t: t.clone(memory_format=torch.contiguous_format)
                              .detach().requires_grad_(t.requires_grad)
                              if isinstance(t, torch.Tensor) else t, args)
            got = outputs_and_grads(mine, inputs)
            close(got, want, f"memory format {module_format}", dtype)
            assert all(t.is_contiguous() for t in tensors(got))


@pytest.mark.parametrize("info,dtype,training", cases(trainings=(True,)))
def test_if_train_and_eval_modes_differ(info, dtype, training):
    """The ModuleInfo says the modes differ (inter-layer dropout): forward reads
    ``training``."""
    assert info.train_and_eval_differ
    for sample in samples(info, dtype, training):
        mine, _ = build(info, sample, dtype, training)
        del mine.training
        with pytest.raises(AttributeError, match="'training'"):
            mine(*sample.forward_input.args)


@pytest.mark.parametrize("info,dtype,training", cases())
def test_device_ctx_init(info, dtype, training):
    """Built under ``torch.device('meta')``: meta parameters with the CPU ones' metadata."""
    for sample in samples(info, dtype, training):
        args, kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
        cpu = CGRU[info.module_cls](*args, **kwargs)
        with torch.device("meta"):
            meta = CGRU[info.module_cls](*args, **kwargs)
        for a, b in zip(meta.parameters(), cpu.parameters(), strict=True):
            assert a.is_meta and a.shape == b.shape and a.dtype == b.dtype
            assert a.stride() == b.stride() and a.requires_grad == b.requires_grad


@pytest.mark.parametrize("info,dtype,training", cases())
def test_errors(info, dtype, training):
    """torch's error samples: the exception type and message torch's tests expect."""
    errors = info.module_error_inputs_func(info, device="cpu", dtype=dtype,
                                           requires_grad=False, training=training)
    assert any(e.error_on == ModuleErrorEnum.FORWARD_ERROR for e in errors)
    for error in errors:
        sample = error.module_error_input
        args, kwargs = sample.constructor_input.args, sample.constructor_input.kwargs
        with pytest.raises(error.error_type, match=error.error_regex):
            m = CGRU[info.module_cls](*args, **kwargs)
            if error.error_on == ModuleErrorEnum.FORWARD_ERROR:
                m(*sample.forward_input.args, **sample.forward_input.kwargs)


def test_every_module_info_is_run():
    assert sorted(info.name for info in INFOS) == ["nn.GRU", "nn.LSTM", "nn.RNN"]
