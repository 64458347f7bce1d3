"""The core ops' kernels registered from C++ (cuda/cpu/ops.cpp, issue 28; docs/design.md §4).

Invariants defended:
* after the first public call, ``cpd::cast``, ``cast_out``, ``encode``, ``decode``, ``arith`` and
  ``matmul`` run the extension's C++ CPU and autograd kernels (the dispatcher's table names
  ops.cpp), and they pass ``torch.library.opcheck`` there (schema, fake, autograd registration,
  AOT dispatch), as the Python registrations did before the extension was loaded;
* the C++ kernels give the bits of the extension's loops called directly (the oracle of this file
  is those loops, themselves tested against exact oracles elsewhere), on non-contiguous inputs,
  broadcast batch dims, ``out`` not contiguous and ``out`` aliasing ``x``;
* autograd: cast straight-through, arith and matmul the gradients of the exact operation (torch's
  own float32 ops as the oracle, broadcast dims reduced), encode/decode/cast_out not differentiable;
* ``cpd._shim.on_host`` swaps the CPU kernels for the CUDA path run by the shim and puts the C++
  kernels back afterwards;
* a fresh process that calls ``torch.ops.cpd.*`` directly (no public call first) still works
  (Python kernels until the C++ ones are installed), and bad direct arguments are clear errors.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.library import opcheck

import cpd
from cpd import _cpu
from cpd.rounding import Rounding

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.skipif(_cpu.forced_fallback(), reason="the C++ kernels need the extension"),
]

ROOT = Path(__file__).resolve().parent.parent
SPEC = cpd.ops._fmt_spec
ZERO = cpd.ops._ZERO_SEED
SR = Rounding.STOCHASTIC.code


def bits_equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.int32) if a.dtype == torch.float32 else a.contiguous(),
        b.contiguous().view(torch.int32) if b.dtype == torch.float32 else b.contiguous())


def sample(*shape, seed=0, scale=30.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.fixture(scope="module")
def ext():
    e = _cpu.extension()
    if e is None:
        pytest.skip("no CPU extension here")
    cpd.cast(torch.zeros(1), cpd.E5M2)  # the first public call installs the C++ kernels
    assert cpd.ops._core.native is e
    return e


def kernel_file(op: str, key: str) -> str:
    """The file the dispatcher's table names for op's kernel at key ('' if none)."""
    for line in torch._C._dispatch_dump_table(f"cpd::{op}").splitlines():
        if line.startswith(f"{key}:"):
            return line
    return ""


OPS = ("cast", "cast_out", "encode", "decode", "arith", "matmul")


def test_cpp_kernels_are_registered(ext):
    for op in OPS:
        assert "ops.cpp" in kernel_file(op, "CPU"), torch._C._dispatch_dump_table(f"cpd::{op}")
        assert "ops.cpp" in kernel_file(op, "AutogradCPU"), torch._C._dispatch_dump_table(f"cpd::{op}")


def test_opcheck_on_the_cpp_kernels(ext):
    x = sample(7, 5).requires_grad_()
    seed = cpd.ops.draw_seed()
    for mode in (0, SR, 3):
        opcheck(torch.ops.cpd.cast.default, (x, seed, SPEC(cpd.E5M2), mode, False, 32))
    out = torch.empty(7, 5)
    opcheck(torch.ops.cpd.cast_out.default, (x.detach(), seed, SPEC(cpd.E4M3), SR, True, 8, out))
    opcheck(torch.ops.cpd.encode.default, (x.detach(), SPEC(cpd.FP16), 0, False))
    opcheck(torch.ops.cpd.decode.default, (torch.arange(124, dtype=torch.uint8), SPEC(cpd.E5M2)))  # no NaN codes
    y, z = sample(7, 5, seed=1).requires_grad_(), sample(7, 5, seed=2).requires_grad_()
    for op in (0, 1, 2):
        opcheck(torch.ops.cpd.arith.default, (op, x, y, z, seed, SPEC(cpd.BF16), SR, False, 32))
    a, b = (sample(2, 3, 6) / 10).requires_grad_(), (sample(6, 4, seed=3) / 10).requires_grad_()  # no overflow: NaN != NaN
    opcheck(torch.ops.cpd.matmul.default, (a, b, seed, SPEC(cpd.E4M3), SPEC(cpd.FP16), True, 0, SR, False, 32))
    opcheck(torch.ops.cpd.matmul.default, (a, b, ZERO, [], SPEC(cpd.FP32), False, 2, 0, False, 32))


@pytest.mark.parametrize("mode", [0, SR, 2, 4])
def test_cast_kernels_give_the_loops_bits(ext, mode):
    x = sample(33, 20)[:, ::3]  # not contiguous
    seed = cpd.ops.draw_seed(torch.Generator().manual_seed(5))
    s, o = seed.tolist()
    for fmt in (cpd.E5M2, cpd.E4M3FN, cpd.FloatFormat(8, 10, bias=140, subnormals=False)):
        want = torch.empty(x.shape)
        ext.cast_out(x.contiguous(), want, *cpd.ops._fmt_args(fmt), mode, True, 7, s, o)
        assert bits_equal(torch.ops.cpd.cast(x, seed, SPEC(fmt), mode, True, 7), want)
        out = torch.empty(7, 33).t()  # not contiguous
        torch.ops.cpd.cast_out(x, seed, SPEC(fmt), mode, True, 7, out)
        assert bits_equal(out, want)
        xx = x.clone()
        torch.ops.cpd.cast_out(xx, seed, SPEC(fmt), mode, True, 7, xx)  # out is x
        assert bits_equal(xx, want)
        if mode != SR:
            codes = torch.ops.cpd.encode(x, SPEC(fmt), mode, True)
            want_codes = torch.empty(x.shape, dtype=codes.dtype)
            ext.encode_out(x.contiguous(), want_codes, *cpd.ops._fmt_args(fmt), mode, True)
            assert bits_equal(codes, want_codes)
            back = torch.empty(x.shape)
            ext.decode_out(codes, back, *cpd.ops._fmt_args(fmt))
            assert bits_equal(torch.ops.cpd.decode(codes.t(), SPEC(fmt)), back.t().contiguous())


@pytest.mark.parametrize("op", [0, 1, 2])
def test_arith_kernel_gives_the_loops_bits(ext, op):
    a, b, c = sample(40, 3), sample(40, 3, seed=1), sample(40, 3, seed=2)
    seed = cpd.ops.draw_seed(torch.Generator().manual_seed(1))
    s, o = seed.tolist()
    for mode in (0, SR, 3):
        want = torch.empty(40, 3)
        ext.arith_out(op, a, b, c, want, *cpd.ops._fmt_args(cpd.BF16), mode, False, 32, s, o, 0)
        assert bits_equal(torch.ops.cpd.arith(op, a.t().contiguous().t(), b, c, seed, SPEC(cpd.BF16), mode, False, 32),
                          want)


@pytest.mark.parametrize("shapes", [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((4, 1, 5, 7), (3, 7, 2)),
                                    ((5, 0), (0, 3)), ((0, 5, 7), (7, 3))])
def test_matmul_kernel_gives_the_loops_bits(ext, shapes):
    sa, sb = shapes
    a, b = sample(*sa) / 8, sample(*sb, seed=1) / 8
    seed = cpd.ops.draw_seed(torch.Generator().manual_seed(2))
    s, o = seed.tolist()
    batch = torch.broadcast_shapes(sa[:-2], sb[:-2])
    M, K, N = sa[-2], sa[-1], sb[-1]
    B = int(torch.tensor(batch).prod()) if batch else 1
    a3 = a.expand(*batch, M, K).reshape(B, M, K).contiguous()
    b3 = b.expand(*batch, K, N).reshape(B, K, N).contiguous()
    for mul, acc, kahan, block, mode in ((cpd.E4M3, cpd.FP16, False, 0, 0), (None, cpd.FP32, False, 0, 0),
                                         (cpd.E5M2, cpd.BF16, True, 3, SR), (None, cpd.FP16, False, 0, 4)):
        want = torch.empty(B, M, N)
        ext.matmul_out(a3, b3, want, mul is not None, *cpd.ops._fmt_args(mul or acc), *cpd.ops._fmt_args(acc), kahan,
                       block, mode, False, 32, s if mode == SR else 0, o if mode == SR else 0, 0)
        got = torch.ops.cpd.matmul(a.transpose(-1, -2).contiguous().transpose(-1, -2), b, seed, SPEC(mul), SPEC(acc),
                                   kahan, block, mode, False, 32)
        assert bits_equal(got, want.reshape(*batch, M, N))


def test_autograd_of_the_cpp_kernels(ext):
    x = sample(6, 4).requires_grad_()
    g = sample(6, 4, seed=9) / 7
    y = cpd.cast(x, cpd.E2M1, "stochastic")
    assert y.grad_fn.name() == "cpd::CastBackward"  # the light node (cuda/cpu/matmul_backward.h)
    y.backward(g)
    assert bits_equal(x.grad, g)  # straight-through
    h = x.detach().half().requires_grad_()  # a float16 input: the gradient comes back as float16
    (gh,) = torch.autograd.grad(cpd.cast(h, cpd.E5M2), h, g.half())
    assert gh.dtype == torch.float16 and torch.equal(gh, g.half())
    gr = g.clone().requires_grad_()  # double backward: the node's own backward is the identity again
    (gg,) = torch.autograd.grad(cpd.cast(x, cpd.E4M3), x, gr, create_graph=True)
    (g2,) = torch.autograd.grad((gg * gg).sum(), gr)
    assert bits_equal(gg.detach(), g) and bits_equal(g2, 2 * g)
    a, b, c = (sample(6, 4, seed=i).requires_grad_() for i in (1, 2, 3))
    for name, fn, grads in (("mul", lambda: cpd.mul(a, b, cpd.BF16), (g * b, g * a, None)),
                            ("add", lambda: cpd.add(a, b, cpd.BF16), (g, g, None)),
                            ("fma", lambda: cpd.fma(c, a, b, cpd.BF16), (g * b, g * a, g))):
        for t in (a, b, c):
            t.grad = None
        y = fn()
        assert y.grad_fn.name() == "cpd::ArithBackward"
        y.backward(g)
        for t, want in zip((a, b, c), grads):
            assert (t.grad is None and want is None) or bits_equal(t.grad, want.detach()), name
    a.grad = b.grad = None
    b.requires_grad_(False)
    y = cpd.mul(a, b, cpd.BF16)  # saves b (for a's gradient) and not a
    with torch.no_grad():
        a.mul_(2)
    y.backward(g)
    assert bits_equal(a.grad, g * b) and b.grad is None
    y = cpd.mul(a, b, cpd.BF16)
    b.mul_(2)  # the saved operand changed: the backward refuses, as torch's own ops do
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    b.requires_grad_(True)
    a, b = sample(2, 1, 5, 7).requires_grad_(), sample(3, 7, 4, seed=1).requires_grad_()
    gy = sample(2, 3, 5, 4, seed=4)
    cpd.matmul(a, b, mul=cpd.E4M3, acc=cpd.FP16).backward(gy)
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    torch.matmul(a2, b2).backward(gy)  # the exact product's gradients, reduced like torch reduces them
    assert torch.allclose(a.grad, a2.grad, rtol=1e-6, atol=1e-5) and a.grad.shape == a.shape
    assert torch.allclose(b.grad, b2.grad, rtol=1e-6, atol=1e-5) and b.grad.shape == b.shape
    a.grad = b.grad = None
    b.requires_grad_(False)
    cpd.matmul(a, b).backward(gy)  # only a's gradient asked for
    assert a.grad is not None and b.grad is None
    sq = sample(5, 5, seed=6).requires_grad_()
    y = cpd.matmul(sq, sq)  # one tensor on both sides: both gradients reach it
    assert y.grad_fn.name() == "cpd::MatmulBackward"
    y.backward(torch.ones(5, 5))
    assert torch.allclose(sq.grad, torch.ones(5, 5) @ sq.detach().T + sq.detach().T @ torch.ones(5, 5), atol=1e-5)
    w = sample(5, 3, seed=7)
    y = cpd.matmul(sq, w)  # saves w (for sq's gradient), not sq: as torch.matmul does
    with torch.no_grad():
        sq.mul_(2)
    y.sum().backward()
    y = cpd.matmul(sq, w)
    w.mul_(2)  # the saved operand changed: the backward refuses, as torch's own ops do
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    codes = cpd.encode(x, cpd.E5M2)
    assert not codes.requires_grad and codes.grad_fn is None
    out = torch.zeros(6, 4)
    cpd.cast(x.detach(), cpd.E5M2, out=out)
    assert out._version == 1  # the mutation is counted (autograd would notice a saved tensor changed)
    with pytest.raises(RuntimeError, match="cast_out is not differentiable"):
        torch.ops.cpd.cast_out(x, ZERO, SPEC(cpd.E5M2), 0, False, 32, out)


def test_on_host_swaps_the_cpu_kernels_and_restores_them(ext):
    from cpd import _shim

    if not _shim.available():
        pytest.skip("no host compiler for the shim")
    x = sample(300) / 10
    want = cpd.cast(x, cpd.E5M2)
    native = cpd.ops._core.native
    assert native.cpu_kernels() == 1  # the loops
    with _shim.on_host():  # the CUDA op bodies, launched from C++ through the shim
        assert "ops.cpp" in kernel_file("cast", "CPU") and native.cpu_kernels() == 2
        assert bits_equal(cpd.cast(x, cpd.E5M2), want)
    assert "ops.cpp" in kernel_file("cast", "CPU") and native.cpu_kernels() == 1
    assert bits_equal(cpd.cast(x, cpd.E5M2), want)
    cpd.ops._core.prefer_native = False
    try:
        with _shim.on_host():  # the Python launches (a GPU machine with no compiler)
            assert "ops.cpp" not in kernel_file("cast", "CPU") and native.cpu_kernels() == 0
            assert bits_equal(cpd.cast(x, cpd.E5M2), want)
    finally:
        cpd.ops._core.prefer_native = True
    assert "ops.cpp" in kernel_file("cast", "CPU") and native.cpu_kernels() == 1


def test_direct_calls_before_any_public_call():
    code = ("import torch, cpd\n"
            "from cpd.ops import _fmt_spec, _ZERO_SEED\n"
            "x = torch.linspace(-3, 3, 101).requires_grad_()\n"
            "y = torch.ops.cpd.cast(x, _ZERO_SEED, _fmt_spec(cpd.E5M2), 0, False, 32)\n"  # Python kernels
            "y.sum().backward()\n"
            "assert torch.equal(x.grad, torch.ones(101))\n"
            "z = cpd.cast(x, cpd.E5M2)\n"  # the first public call installs the C++ kernels
            "assert cpd.ops._core.native is not None\n"
            "assert torch.equal(y, z) and torch.equal(torch.ops.cpd.cast(x, _ZERO_SEED, _fmt_spec(cpd.E5M2), 0, False, 32), y)\n"
            "print('ok')\n")
    env = dict(os.environ)
    env.pop("CPD_NO_EXTENSION", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_bad_direct_arguments_are_clear_errors(ext):
    x = sample(4)
    with pytest.raises(RuntimeError, match=r"format argument \(fmt\) is \[exp, man, bias, specials, subnormals\]"):
        torch.ops.cpd.cast(x, ZERO, [5, 2], 0, False, 32)
    with pytest.raises(RuntimeError, match="x must be float32"):
        torch.ops.cpd.cast(x.double(), ZERO, SPEC(cpd.E5M2), 0, False, 32)
    with pytest.raises(RuntimeError, match="seed must be a CPU int64 tensor of 2 elements"):
        torch.ops.cpd.cast(x, torch.zeros(3, dtype=torch.int64), SPEC(cpd.E5M2), SR, False, 32)
    with pytest.raises(RuntimeError, match="must not be empty"):
        torch.ops.cpd.matmul(x[None], x[:, None], ZERO, [], [], False, 0, 0, False, 32)
    with pytest.raises(RuntimeError, match="arith op is 0 \\(mul\\), 1 \\(add\\) or 2 \\(fma\\)"):
        torch.ops.cpd.arith(3, x, x, x, ZERO, SPEC(cpd.BF16), 0, False, 32)


def test_dispatch_benchmark_prints_its_table():
    """benchmarks/bench_dispatch.py runs (tiny settings) and prints one row per operation."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("CPD_BENCH_RECORD", None)
    r = subprocess.run([sys.executable, "benchmarks/bench_dispatch.py", "--reps", "1", "--calls", "20", "--sizes", "10"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| cpd.")]
    assert len(rows) == 12 and all(ln.count("|") == 7 for ln in rows), r.stdout


@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "toward_zero", "up", "down", "nearest_away", "odd"])
def test_cpp_and_python_launches_give_the_same_bits(ext, rounding):
    """The C++ launches (cuda/cpu/launch.cpp: parameter block, grid, kernel choice) and the Python
    ones (cpd/_kernels.py) run the same CUDA kernels with the same arguments: through the host
    shim, every core op gives the same bits both ways, and the CPU loops' bits."""
    from cpd import _shim

    if not _shim.available():
        pytest.skip("no host compiler for the shim")
    torch.manual_seed(11)
    x = sample(301) / 7
    a, b = torch.randn(3, 5, 19), torch.randn(19, 6)
    configs = [dict(mul=cpd.E4M3, acc=cpd.FP16), dict(mul=None, acc=cpd.FP32), dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10)),
               dict(mul=cpd.E5M2, acc=cpd.BF16, kahan=True), dict(mul=None, acc=cpd.BF16)]

    def run():
        gen = torch.Generator().manual_seed(5)
        g = gen if rounding == "stochastic" else None
        out = [cpd.cast(x, cpd.E5M2, rounding=rounding, generator=g), cpd.cast(x, cpd.BF16, rounding=rounding, generator=g),
               cpd.mul(x, x.flip(0), cpd.E4M3, rounding=rounding, generator=g),
               cpd.fma(x, x, x.flip(0), cpd.FP16, rounding=rounding, generator=g)]
        if rounding != "stochastic":
            out += [cpd.decode(cpd.encode(x, f, rounding=rounding), f).float() for f in (cpd.E4M3, cpd.FP16)]
        out += [cpd.matmul(a, b, rounding=rounding, generator=g, **c) for c in configs]
        return out

    want = run()
    with _shim.on_host(threads=32, max_blocks=3):
        native = run()
    cpd.ops._core.prefer_native = False
    try:
        with _shim.on_host(threads=32, max_blocks=3):
            python = run()
    finally:
        cpd.ops._core.prefer_native = True
    for i, (w, n, p) in enumerate(zip(want, native, python)):
        assert bits_equal(n, p), i
        assert bits_equal(n, w), i


# ------------------------------------------------------------------------------------ on a GPU
CUDA_CONFIGS = [dict(mul=cpd.E4M3, acc=cpd.FP16), dict(mul=None, acc=cpd.FP32), dict(mul=cpd.E5M2, acc=cpd.FP16),
                dict(mul=cpd.E5M2, acc=cpd.FP16, kahan=True), dict(mul=cpd.E4M3, acc=cpd.BF16),
                dict(mul=None, acc=cpd.BF16, kahan=True)]


@pytest.mark.cuda
def test_cuda_kernels_launch_from_cpp_with_the_cpu_bits(ext):
    """After the first CUDA call, the core ops' CUDA kernels are the extension's (C++ launches),
    and every op gives the CPU's bits (stochastic too: a just-seeded CUDA generator draws the
    CPU generator's pairs)."""
    x = sample(4099) / 10
    xc = x.cuda()
    cpd.cast(xc, cpd.E5M2)  # the Python path: compiles, loads, finds the kernels usable
    cpd.cast(xc, cpd.E5M2)  # the public call that installs the C++ CUDA kernels
    assert cpd.ops._core.native_cuda and "ops.cpp" in kernel_file("cast", "CUDA")
    for mode in ("nearest", "toward_zero", "up", "down", "nearest_away", "odd"):
        assert bits_equal(cpd.cast(xc, cpd.E4M3, rounding=mode).cpu(), cpd.cast(x, cpd.E4M3, rounding=mode)), mode
        for f in (cpd.E4M3, cpd.FP16):
            codes = cpd.encode(xc, f, rounding=mode)
            assert bits_equal(codes.cpu(), cpd.encode(x, f, rounding=mode)) and bits_equal(
                cpd.decode(codes, f).cpu(), cpd.decode(codes.cpu(), f))
    gpu = cpd.cast(xc, cpd.E5M2, rounding="stochastic", generator=torch.Generator("cuda").manual_seed(3))
    cpu = cpd.cast(x, cpd.E5M2, rounding="stochastic", generator=torch.Generator().manual_seed(3))
    assert bits_equal(gpu.cpu(), cpu)
    assert bits_equal(cpd.fma(xc, xc, xc.flip(0), cpd.FP16).cpu(), cpd.fma(x, x, x.flip(0), cpd.FP16))
    out = torch.empty_like(xc)
    cpd.cast(xc, cpd.BF16, out=out)
    assert bits_equal(out.cpu(), cpd.cast(x, cpd.BF16))
    a, b = sample(2, 67, 130, seed=1), sample(130, 45, seed=2)
    for c in CUDA_CONFIGS:
        assert bits_equal(cpd.matmul(a.cuda(), b.cuda(), **c).cpu(), cpd.matmul(a, b, **c)), c
    a.requires_grad_()
    ag = a.detach().cuda().requires_grad_()
    cpd.matmul(ag, b.cuda(), **CUDA_CONFIGS[0]).sum().backward()
    cpd.matmul(a, b, **CUDA_CONFIGS[0]).sum().backward()
    assert torch.allclose(ag.grad.cpu(), a.grad)


@pytest.mark.cuda
def test_cuda_graph_and_compile_replay_eager_bits(ext):
    """A cpd.cast + cpd.matmul step captured in a CUDA graph replays eager's bits on new inputs,
    and torch.compile of the step gives eager's bits (the kernels launch on the current stream
    with no host sync)."""
    x = (sample(96, 80, seed=4) / 4).cuda()
    w = (sample(80, 48, seed=5) / 4).cuda()

    def step(v):
        return cpd.matmul(cpd.cast(v, cpd.E4M3), w, mul=cpd.E4M3, acc=cpd.FP16)

    for _ in range(3):  # warm up: NVRTC images, the C++ kernels installed
        step(x)
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(static)
    for seed in (6, 7):
        fresh = (sample(96, 80, seed=seed) / 4).cuda()
        static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert bits_equal(captured.cpu(), step(fresh).cpu()), seed
    compiled = torch.compile(step, fullgraph=False)
    assert bits_equal(compiled(x).cpu(), step(x).cpu())


def test_cpp_launches_pick_the_python_launches_matmul_kernel(ext):
    """launch.cpp chooses matmul.cu's kernel with cpd/gemm.h's gemm_family; cpd/_kernels.py's
    matmul_family mirrors it in Python: the same kernel for every spec (a drift would cost speed
    only, never bits, since each kernel checks its family on the device)."""
    from cpd import _kernels

    fmts = [cpd.E4M3, cpd.E5M2, cpd.E4M3FN, cpd.E2M1, cpd.FP16, cpd.BF16, cpd.FP32, cpd.TF32, cpd.FloatFormat(5, 10),
            cpd.FloatFormat(6, 9), cpd.FloatFormat(4, 3, subnormals=False)]
    seen = set()
    for mul in [None, *fmts]:
        for acc in fmts:
            for kahan, block in ((False, 0), (True, 0), (False, 4), (True, 3)):
                for mode in (0, 1, 2):
                    for saturate in (False, True):
                        m5, a5 = (SPEC(mul) if mul is not None else SPEC(acc)), SPEC(acc)
                        family = _kernels.matmul_family(tuple(m5) if mul is not None else None, tuple(a5), kahan,
                                                        block, mode, saturate)
                        want = _kernels.FAMILY_KERNELS[family][0] if family in _kernels.FAMILY_KERNELS \
                            else "cpd_matmul_tiled"
                        got = ext.matmul_kernel(mul is not None, list(m5), list(a5), kahan, block, mode, saturate)
                        assert got == want, (mul, acc, kahan, block, mode, saturate)
                        seen.add(got)
    assert seen == {name for name, _ in _kernels.FAMILY_KERNELS.values()} | {"cpd_matmul_tiled"}, seen  # every one
