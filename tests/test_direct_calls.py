"""The direct calls: cpd's hot ops called from Python straight into torch's dispatcher through the
extension's ``call_*`` functions (cuda/cpu/ops.cpp "direct calls", cpd/_impl.py ``direct``;
issue 28) instead of through ``torch.ops``.

Invariants defended:
* once the extension is installed, ``cpd.cast`` (with and without ``out=``), ``cpd.add`` /
  ``mul`` / ``fma``, ``cpd.matmul`` (a tensor-core accumulator's fused dot too, block-scaled or
  not), ``cpd.mx.cast`` (with and without ``out=``), ``encode`` and ``decode`` take the direct
  call, and give the bits of ``torch.ops.cpd.*`` called with the same arguments (the stochastic
  modes with the same seed), gradients included (the same C++ autograd node); the stochastic
  seed pair is drawn by the extension's ``at::randint``: torch.randint's values and generator
  state;
* everything ``torch.ops`` adds is kept: a ``__torch_function__`` mode sees the op, a tensor
  subclass's ``__torch_function__`` runs, and ``torch.compile(fullgraph=True)`` traces the op
  (no graph break) with eager's bits; dispatch modes (fake tensors) still work;
* a kernel's error reaches Python as from ``torch.ops``: the message without a C++ backtrace,
  ``out=``'s version counter is bumped, inputs are never modified.
"""

import pytest
import torch
from torch.overrides import TorchFunctionMode

import cpd
from cpd import _cpu, _impl, mx

pytestmark = pytest.mark.skipif(_cpu.forced_fallback(), reason="the direct calls are the extension's")


def _ext():
    for _ in range(2):  # the first call loads the extension, the next installs its kernels
        cpd.cast(torch.ones(4), cpd.E5M2)
    ext = _impl.direct(torch.ones(1))
    assert ext is not None and ext is _impl._core.native
    return ext


class _Spy:
    """Counts the calls of the extension's call_<name> (the direct path) while active."""

    def __init__(self, monkeypatch, ext, name):
        self.calls = 0
        real = getattr(ext, name)

        def spy(*args):
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(ext, name, spy)


def _bits(t):
    return t.contiguous().view(torch.int32)


CASES = {
    "cast": ("call_cast", lambda x, y, g: cpd.cast(x, cpd.E4M3, "stochastic", generator=g)),
    "cast_out": ("call_cast_out", lambda x, y, g: cpd.cast(x, cpd.E5M2, "down", out=torch.empty_like(x))),
    "add": ("call_arith", lambda x, y, g: cpd.add(x, y, cpd.BF16, "stochastic", generator=g)),
    "fma": ("call_arith", lambda x, y, g: cpd.fma(x, y, x, cpd.FP16)),
    "matmul": ("call_matmul", lambda x, y, g: cpd.matmul(x, y.t(), mul=cpd.E4M3, acc=cpd.FP16)),
    "matmul_sr": ("call_matmul", lambda x, y, g: cpd.matmul(x, y.t(), acc=cpd.BF16, rounding="stochastic",
                                                            generator=g)),
    "tensor_core": ("call_fused_dot_matmul",
                    lambda x, y, g: cpd.matmul(x, y.t(), acc=cpd.tensor_core("hopper", a="e5m2"))),
    "tensor_core_nvfp4": ("call_fused_dot_matmul",
                          lambda x, y, g: cpd.matmul(x, y.t(), acc=cpd.tensor_core("blackwell", a="nvfp4"))),
    "mx.cast": ("call_mx_cast", lambda x, y, g: mx.cast(x, mx.MXFP8_E4M3, "stochastic", generator=g)),
    "mx.cast_out": ("call_mx_cast_out", lambda x, y, g: mx.cast(x, mx.NVFP4, out=torch.empty_like(x))),
    "encode": ("call_encode", lambda x, y, g: cpd.encode(x, cpd.E4M3, "up")),
    "decode": ("call_decode", lambda x, y, g: cpd.decode((x * 40).to(torch.int64) & 0xFF, cpd.E5M2)),
    "draw_seed": ("draw_seed", lambda x, y, g: cpd.ops.draw_seed(g)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_direct_call_taken_and_equal_to_torch_ops(case, monkeypatch):
    """Each public op takes its direct call, with the bits of the torch.ops path (the same
    generator state for the stochastic ones)."""
    ext = _ext()
    name, fn = CASES[case]
    x, y = torch.randn(32, 64) * 4, torch.randn(32, 64)
    x0, y0 = x.clone(), y.clone()
    spy = _Spy(monkeypatch, ext, name)
    direct = fn(x, y, torch.Generator().manual_seed(7))
    assert spy.calls == 1
    monkeypatch.setattr(_impl._core, "native", None)  # direct() says no: the torch.ops path
    via_ops = fn(x, y, torch.Generator().manual_seed(7))
    assert spy.calls == 1
    assert torch.equal(_bits(direct), _bits(via_ops))
    assert torch.equal(x, x0) and torch.equal(y, y0)


@pytest.mark.parametrize("seeded", [False, True])
def test_draw_seed_is_torch_randint(seeded, monkeypatch):
    """The extension's draw_seed is torch.randint's pair: the same values from the same generator
    state, and the generator advanced alike (the default generator, or one passed)."""
    ext = _ext()
    spy = _Spy(monkeypatch, ext, "draw_seed")
    gen = torch.Generator().manual_seed(11) if seeded else None
    state_of = gen if seeded else torch.default_generator
    for _ in range(3):
        before = state_of.get_state()
        got = cpd.ops.draw_seed(gen)
        after = state_of.get_state()
        state_of.set_state(before)
        want = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=gen)
        assert got.dtype == torch.int64 and got.device.type == "cpu" and torch.equal(got, want)
        assert torch.equal(state_of.get_state(), after)
    assert spy.calls == 3


def test_direct_matmul_backward_is_the_cpp_node():
    """The direct matmul records the same C++ node as torch.ops, with the same gradients."""
    _ext()
    a, b = torch.randn(8, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    g = torch.randn(8, 4)
    y = cpd.matmul(a, b, mul=cpd.E5M2, acc=cpd.FP16)
    assert y.grad_fn.name() == "cpd::MatmulBackward"
    ga, gb = torch.autograd.grad(y, (a, b), g)
    y2 = torch.ops.cpd.matmul(a, b, cpd.ops._ZERO_SEED, cpd.ops._fmt_spec(cpd.E5M2), cpd.ops._fmt_spec(cpd.FP16),
                              False, 0, 0, False, 32)
    ga2, gb2 = torch.autograd.grad(y2, (a, b), g)
    assert torch.equal(y, y2) and torch.equal(ga, ga2) and torch.equal(gb, gb2)
    assert torch.equal(ga, g @ b.detach().t()) and torch.equal(gb, a.detach().t() @ g)


def test_parameters_take_the_direct_call(monkeypatch):
    ext = _ext()
    spy = _Spy(monkeypatch, ext, "call_matmul")
    w = torch.nn.Parameter(torch.randn(16, 4))
    cpd.matmul(torch.randn(2, 16), w, acc=cpd.BF16).sum().backward()
    assert spy.calls == 1 and w.grad is not None


class _Seen(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.funcs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


def test_torch_function_mode_sees_the_ops(monkeypatch):
    """Under a __torch_function__ mode the calls go through torch.ops, which the mode sees."""
    ext = _ext()
    spies = [_Spy(monkeypatch, ext, n)
             for n in ("call_cast", "call_matmul", "call_arith", "call_mx_cast", "call_fused_dot_matmul",
                       "call_encode", "call_decode", "draw_seed")]
    x = torch.randn(4, 32)
    with _Seen() as seen:
        cpd.cast(x, cpd.E5M2, "stochastic")
        cpd.decode(cpd.encode(x, cpd.E5M2), cpd.E5M2)
        cpd.matmul(x, x.t(), acc=cpd.FP16)
        cpd.mul(x, x, cpd.E4M3)
        mx.cast(x, mx.MXFP8_E5M2)
        cpd.matmul(x, x.t(), acc=cpd.tensor_core("hopper"))
    assert all(s.calls == 0 for s in spies)
    names = {str(f) for f in seen.funcs}
    assert torch.randint in seen.funcs  # the stochastic cast's seed
    for op in ("cpd.cast.default", "cpd.matmul.default", "cpd.arith.default", "cpd_mx.cast.default",
               "cpd.fused_dot_matmul.default", "cpd.encode.default", "cpd.decode.default"):
        assert op in names, (op, sorted(names))


class _Tagged(torch.Tensor):
    """A subclass whose __torch_function__ counts the cpd ops it sees."""

    seen = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if "cpd" in str(func):
            cls.seen += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_subclass_torch_function_runs(monkeypatch):
    ext = _ext()
    spy = _Spy(monkeypatch, ext, "call_cast")
    x = torch.randn(64).as_subclass(_Tagged)
    _Tagged.seen = 0
    y = cpd.cast(x, cpd.E4M3)
    assert spy.calls == 0 and _Tagged.seen == 1
    assert torch.equal(y.as_subclass(torch.Tensor), cpd.cast(x.as_subclass(torch.Tensor), cpd.E4M3))


def test_compile_traces_the_ops_without_graph_breaks():
    """torch.compile(fullgraph=True) traces each op (the direct call is never taken while
    compiling: a graph break would fail here) and gives eager's bits."""
    _ext()

    def fn(x, w):
        h = cpd.matmul(cpd.cast(x, cpd.E4M3), w, acc=cpd.BF16)
        h = cpd.add(h, x[:, :8], cpd.BF16, "stochastic")
        h = cpd.matmul(h, w.t()[:, :8], acc=cpd.tensor_core("hopper", a="e5m2"))
        return mx.cast(h, mx.MXFP8_E4M3), cpd.cast(h, cpd.E5M2, out=torch.empty_like(h))

    x, w = torch.randn(32, 64), torch.randn(64, 8)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.manual_seed(3)
    eager = fn(x, w)
    torch.manual_seed(3)
    comp = compiled(x, w)
    for e, c in zip(eager, comp):
        assert torch.equal(_bits(e), _bits(c))


def test_fake_tensors_still_dispatch():
    """A dispatch mode (fake tensors) lives below torch.ops: the direct call reaches it too."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _ext()
    with FakeTensorMode(allow_non_fake_inputs=True):  # the seed pair is a real CPU tensor
        a, b = torch.empty(3, 5), torch.empty(5, 7)
        y = cpd.matmul(a, b, acc=cpd.FP16)
        z = cpd.cast(a, cpd.E5M2)
    assert y.shape == (3, 7) and z.shape == (3, 5)


def test_kernel_errors_read_as_from_torch_ops():
    """An error raised in a kernel arrives as torch.ops' would: a RuntimeError, no C++ backtrace."""
    ext = _ext()
    x, seed = torch.randn(8), cpd.ops._ZERO_SEED
    with pytest.raises(RuntimeError) as direct_err:
        ext.call_cast(x, seed, [5, 2], 0, False, 32)  # a format is 5 ints
    with pytest.raises(RuntimeError) as ops_err:
        torch.ops.cpd.cast(x, seed, [5, 2], 0, False, 32)
    assert "Exception raised from" not in str(direct_err.value)
    assert str(direct_err.value).splitlines()[0] == str(ops_err.value).splitlines()[0]


def test_cast_out_bumps_the_version_counter():
    _ext()
    x, out = torch.randn(16), torch.empty(16)
    v = out._version
    cpd.cast(x, cpd.E5M2, out=out)
    assert out._version > v and torch.equal(out, cpd.cast(x, cpd.E5M2))
