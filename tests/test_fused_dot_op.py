"""``cpd::fused_dot_matmul`` (the op behind :func:`cpd.tensor_core_matmul`) with its CPU and
autograd kernels registered from C++ (cuda/cpu/fused_dot.cpp, issue 28).

Invariants defended:
* once the extension is loaded, the first public call installs the C++ CPU and autograd kernels
  (the dispatcher's table names fused_dot.cpp) and the op passes ``torch.library.opcheck`` there
  (schema, fake, autograd registration), plain and block-scaled;
* the C++ CPU kernel gives the bits of the pure-torch body (:func:`cpd._fused_dot_ref.matmul_torch`,
  tested against the exact specification elsewhere) with broadcast batch dims, non-contiguous
  operands and block scales;
* autograd is straight-through, the gradients of the exact float32 product (torch's own matmul as
  the oracle, broadcast dims reduced), for either operand alone; no node without grad mode;
* a fresh process that calls the op directly before any public call runs the Python kernels, and
  the same call after the C++ kernels are installed gives the same bits.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.library import opcheck

import cpd
from cpd import _cpu, _tensor_core_op
_tc = sys.modules["cpd.tensor_core"]  # the module (the attribute cpd.tensor_core is the function)

pytestmark = pytest.mark.skipif(_cpu.forced_fallback(), reason="the C++ kernels need the extension")
ROOT = Path(__file__).resolve().parent.parent
HOPPER = cpd.tensor_core("hopper", a="e4m3")
FIELDS = (HOPPER.a.man, HOPPER.a.emax, HOPPER.b.man, HOPPER.b.emax)


@pytest.fixture(scope="module")
def ext():
    e = _cpu.extension()
    if e is None:
        pytest.skip("no CPU extension here")
    cpd.matmul(torch.ones(2, 2), torch.ones(2, 2), acc=HOPPER)  # the first public call installs the kernels
    return e


def operands(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [cpd.cast(torch.randn(*s, generator=g) * 8, cpd.E4M3FN, saturate=True) for s in shapes]


def args_of(a, b, acc=HOPPER, fields=FIELDS, sa=None, sb=None, block=1, s_emin=-127):
    empty = a.new_empty((0,))
    return (a, b, empty if sa is None else sa, empty if sb is None else sb, block, s_emin, *acc.params, *fields)


def bits(t):
    return t.contiguous().view(torch.int32)


def table_line(key: str) -> str:
    for line in torch._C._dispatch_dump_table("cpd::fused_dot_matmul").splitlines():
        if line.startswith(f"{key}:"):
            return line
    return ""


def test_cpp_kernels_are_installed(ext):
    assert "fused_dot.cpp" in table_line("CPU"), torch._C._dispatch_dump_table("cpd::fused_dot_matmul")
    assert "fused_dot.cpp" in table_line("AutogradCPU")


def test_opcheck(ext):
    a, b = operands((5, 40), (40, 3))
    opcheck(torch.ops.cpd.fused_dot_matmul.default, args_of(a.requires_grad_(), b.requires_grad_()))
    a, b = operands((2, 1, 4, 33), (3, 33, 6), seed=1)
    opcheck(torch.ops.cpd.fused_dot_matmul.default, args_of(a, b))
    mx = cpd.tensor_core("blackwell", a="mxfp8_e4m3")
    pa, sa, _ = _tc._block_operand(torch.randn(4, 64), mx.a_block, -1)
    pb, sb, _ = _tc._block_operand(torch.randn(64, 5), mx.b_block, -2)
    opcheck(torch.ops.cpd.fused_dot_matmul.default,
            args_of(pa, pb, mx, (mx.a.man, mx.a.emax, mx.b.man, mx.b.emax), sa, sb, mx.a_block.block_size,
                    mx.a_block.scale.emin))


@pytest.mark.parametrize("shapes", [((7, 48), (48, 9)), ((2, 1, 5, 33), (3, 33, 4)), ((4, 17, 16), (16, 2)),
                                    ((0, 8), (8, 3)), ((3, 0), (0, 2))])
def test_cpu_kernel_gives_the_torch_bodys_bits(ext, shapes):
    a, b = operands(*shapes, seed=len(shapes[0]))
    got = torch.ops.cpd.fused_dot_matmul(*args_of(a, b))
    want = _tensor_core_op._run(a, b, a.new_empty((0,)), a.new_empty((0,)), 1, -127, HOPPER.params, FIELDS,
                                _tensor_core_op._torch_body)
    assert got.shape == want.shape and torch.equal(bits(got), bits(want))
    if a.dim() == 2 and a.numel():  # non-contiguous operands
        got_t = torch.ops.cpd.fused_dot_matmul(*args_of(a.t().contiguous().t(), b.t().contiguous().t()))
        assert torch.equal(bits(got_t), bits(want))


def test_block_scaled_operands_broadcast(ext):
    mx = cpd.tensor_core("blackwell", a="mxfp8_e4m3")
    fields = (mx.a.man, mx.a.emax, mx.b.man, mx.b.emax)
    g = torch.Generator().manual_seed(3)
    pa, sa, _ = _tc._block_operand(torch.randn(2, 1, 3, 96, generator=g), mx.a_block, -1)
    pb, sb, _ = _tc._block_operand(torch.randn(4, 96, 5, generator=g), mx.b_block, -2)
    blk, s_emin = mx.a_block.block_size, mx.a_block.scale.emin
    got = torch.ops.cpd.fused_dot_matmul(*args_of(pa, pb, mx, fields, sa, sb, blk, s_emin))
    want = _tensor_core_op._run(pa, pb, sa, sb, blk, s_emin, mx.params, fields, _tensor_core_op._torch_body)
    assert got.shape == (2, 4, 3, 5) and torch.equal(bits(got), bits(want))


def test_autograd_is_straight_through(ext):
    a0, b0 = operands((2, 1, 6, 40), (3, 40, 7), seed=5)
    g = torch.randn(2, 3, 6, 7, generator=torch.Generator().manual_seed(9))
    for need_a, need_b in ((True, True), (True, False), (False, True)):
        a, b = a0.clone().requires_grad_(need_a), b0.clone().requires_grad_(need_b)
        y = torch.ops.cpd.fused_dot_matmul(*args_of(a, b))
        assert y.grad_fn.name() == "cpd::FusedDotMatmulBackward"
        y.backward(g)
        ar, br = a0.clone().requires_grad_(need_a), b0.clone().requires_grad_(need_b)
        torch.matmul(ar, br).backward(g)
        for got, want in ((a.grad, ar.grad), (b.grad, br.grad)):
            assert (got is None) == (want is None) and (got is None or torch.equal(got, want))
    with torch.no_grad():
        assert torch.ops.cpd.fused_dot_matmul(*args_of(a0.requires_grad_(), b0)).grad_fn is None


def test_public_call_gradients(ext):
    a = torch.randn(5, 32, requires_grad=True)
    b = torch.randn(32, 4, requires_grad=True)
    cpd.matmul(a, b, acc=HOPPER).sum().backward()
    assert torch.equal(a.grad, torch.ones(5, 4) @ cpd.cast(b.detach(), cpd.E4M3FN, saturate=True).t())


def test_direct_call_before_and_after_install():
    code = (
        "import torch, cpd\n"
        "from cpd import _tensor_core_op\n"
        "h = cpd.tensor_core('hopper', a='e4m3')\n"
        "a = cpd.cast(torch.randn(4, 40, generator=torch.Generator().manual_seed(0)), cpd.E4M3FN, saturate=True)\n"
        "b = cpd.cast(torch.randn(40, 3, generator=torch.Generator().manual_seed(1)), cpd.E4M3FN, saturate=True)\n"
        "f = (h.a.man, h.a.emax, h.b.man, h.b.emax)\n"
        "e = a.new_empty((0,))\n"
        "y0 = torch.ops.cpd.fused_dot_matmul(a, b, e, e, 1, -127, *h.params, *f)\n"
        "assert 'fused_dot.cpp' not in torch._C._dispatch_dump_table('cpd::fused_dot_matmul')\n"
        "cpd.matmul(a, b, acc=h)\n"
        "assert 'fused_dot.cpp' in torch._C._dispatch_dump_table('cpd::fused_dot_matmul')\n"
        "y1 = torch.ops.cpd.fused_dot_matmul(a, b, e, e, 1, -127, *h.params, *f)\n"
        "assert torch.equal(y0.view(torch.int32), y1.view(torch.int32))\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr
