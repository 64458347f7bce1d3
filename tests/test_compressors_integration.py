"""Compressors inside the emulated collectives and training (cpd/compressors/reduce.py, the
``compressor=`` options of cpd.allreduce and cpd.APSOptimizer, ``python -m cpd demo --compressor``).

Invariant: the compressed allreduce follows its documented order (checked on a lossless
compressor against float32 sums in that order, and on a hand-worked threshold example including
the bytes counted per link); every worker's error-feedback state conserves its gradients; the
optimizer keeps one state per parameter per worker, skips non-finite steps without touching them,
and with a lossless compressor trains exactly like float32 communication; the fmt path is
unchanged when no compressor is given; misuse raises errors naming the argument.
"""

from __future__ import annotations

import argparse
from fractions import Fraction

import pytest
import torch

import cpd
from cpd.compressors import Bitpack, CompressorState, Threshold, compressed_allreduce


def _ring_f32(xs):
    """Ring reduce-scatter order of cpd.allreduce, in float32, on flat tensors."""
    w, n = len(xs), xs[0].numel()
    from cpd.collectives import chunk_bounds

    out = torch.empty(n)
    for c, (a, b) in enumerate(chunk_bounds(n, w)):
        s = xs[c][a:b].clone()
        for h in range(1, w):
            s = s + xs[(c + h) % w][a:b]
        out[a:b] = s
    return out


def test_lossless_ring_is_float32_ring_order():
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(103, generator=g) * 10 ** (i % 3) for i in range(5)]
    r, info = compressed_allreduce(xs, Bitpack(4), algorithm="ring")
    assert torch.equal(r, _ring_f32(xs))
    assert info["bytes"] == info["fp32_bytes"] == 2 * 4 * 4 * 103
    p, _ = compressed_allreduce(xs, Bitpack(4), algorithm="pairwise")
    want = xs[0].clone()
    for x in xs[1:]:
        want = want + x
    assert torch.equal(p, want)


def test_threshold_ring_by_hand():
    # W=2, n=2, tau=1: chunk 0 = element 0 (starts at worker 0), chunk 1 = element 1 (worker 1).
    # q0 = decode(encode([3, 0.5])) = [1, 0], q1 = decode(encode([0.625, -2])) = [0, -1].
    # chunk 0: worker 0 sends +tau (4 bytes); worker 1: 1 + q1[0] = 1, re-encoded: 1 is not > tau,
    # nothing is sent in the allgather (0 bytes). chunk 1: worker 1 sends -tau (4 bytes); worker 0:
    # -1 + q0[1] = -1, re-encoded: nothing. Result [0, 0]; 8 bytes against 2 * 1 * 4 * 2 = 16.
    xs = [torch.tensor([3.0, 0.5]), torch.tensor([0.625, -2.0])]
    states = [CompressorState(), CompressorState()]
    r, info = compressed_allreduce(xs, Threshold(1.0), states=states)
    assert r.tolist() == [0.0, 0.0]
    assert info["bytes"] == 8 and info["fp32_bytes"] == 16
    assert states[0].residual.tolist() == [2.0, 0.5] and states[1].residual.tolist() == [0.625, -1.0]
    assert xs[0].tolist() == [3.0, 0.5]   # inputs untouched


@pytest.mark.parametrize("name", ["onebit", "adaptive:4", "threshold:0.5", "dynamic_tree", "e4m3"])
def test_allreduce_compressor_option(name):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(4, 16, 6, generator=g)
    comp = cpd.compressors.get(name)
    states = [CompressorState() for _ in range(4)] if comp.error_feedback else None
    r = cpd.allreduce(xs, compressor=comp, states=states)
    assert r.shape == (16, 6)
    exact = xs.double().sum(0)
    assert float((r.double() - exact).norm() / exact.norm()) < 1.5
    if states is not None:  # every worker's contribution: what it sent plus its residual is its gradient
        r2, info = compressed_allreduce(xs, comp, states=[CompressorState() for _ in range(4)])
        assert torch.equal(r, r2) and info["bytes"] < info["fp32_bytes"]


def test_error_feedback_conservation_per_worker():
    g = torch.Generator().manual_seed(2)
    comp = cpd.compressors.get("onebit")
    states = [CompressorState() for _ in range(3)]
    total = [[Fraction(0)] * 20 for _ in range(3)]
    sent = [[Fraction(0)] * 20 for _ in range(3)]
    for _ in range(4):
        xs = [torch.randn(5, 4, generator=g) for _ in range(3)]
        before = [s.residual.clone() if s.residual is not None else torch.zeros(5, 4, dtype=torch.float64)
                  for s in states]
        compressed_allreduce(xs, comp, states=states)
        for w in range(3):
            q = xs[w].double() + before[w] - states[w].residual      # what worker w contributed
            total[w] = [a + Fraction(v) for a, v in zip(total[w], xs[w].reshape(-1).tolist())]
            sent[w] = [a + Fraction(v) for a, v in zip(sent[w], q.reshape(-1).tolist())]
    for w in range(3):
        resid = [Fraction(v) for v in states[w].residual.reshape(-1).tolist()]
        assert [s + r for s, r in zip(sent[w], resid)] == total[w]


def test_allreduce_fmt_path_unchanged_and_errors():
    x = torch.randn(3, 10)
    assert torch.equal(cpd.allreduce(x, "e5m2"), cpd.allreduce(x, cpd.E5M2, algorithm="ring"))
    with pytest.raises(ValueError, match="fmt"):
        cpd.allreduce(x, "e5m2", compressor="onebit")
    with pytest.raises(ValueError, match="kahan"):
        cpd.allreduce(x, compressor="onebit", kahan=True)
    with pytest.raises(TypeError, match="needs fmt"):
        cpd.allreduce(x)
    with pytest.raises(ValueError, match="states"):
        cpd.allreduce(x, "e5m2", states=[])
    with pytest.raises(ValueError, match="algorithm='tree'"):
        cpd.allreduce(x, compressor="onebit", algorithm="tree")
    with pytest.raises(ValueError, match="error_feedback=False"):
        cpd.allreduce(x, compressor="dynamic_tree", states=[CompressorState() for _ in range(3)])
    with pytest.raises(TypeError, match="states must be"):
        cpd.allreduce(x, compressor="onebit", states=[CompressorState()])
    with pytest.raises(ValueError, match="inf or NaN"):
        cpd.allreduce(torch.tensor([[1.0], [float("nan")]]), compressor="onebit")


def _train(comm, steps=3, workers=2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = cpd.APSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), workers=workers, model=model, **comm)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)
        opt.zero_grad()
        for wx, wy in opt.split(x, y):
            torch.nn.functional.cross_entropy(model(wx), wy).backward()
            opt.collect()
        opt.step()
    return model, opt


def test_optimizer_lossless_compressor_matches_fp32():
    m1, _ = _train(dict(fmt=cpd.FP32, scaling=None))
    m2, opt = _train(dict(compressor=Bitpack(4)))
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    assert isinstance(opt.last_report, cpd.compressors.CompressionReport)
    assert opt.last_report.bytes == opt.last_report.fp32_bytes > 0


def test_optimizer_keeps_states_per_parameter_per_worker_and_skips_nonfinite():
    model, opt = _train(dict(compressor="onebit"), workers=3)
    assert set(opt.compressor_states) == {n for n, _ in model.named_parameters()}
    assert all(len(v) == 3 and v[0].steps == 3 for v in opt.compressor_states.values())
    assert opt.last_report.bytes < opt.last_report.fp32_bytes
    saved = {n: [s.residual.clone() for s in v] for n, v in opt.compressor_states.items()}
    weights = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.full_like(p, float("inf"))
        opt.collect()
    assert opt.step() is None and opt.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    for n, v in opt.compressor_states.items():
        assert all(torch.equal(s.residual, r) for s, r in zip(v, saved[n]))
    _, opt2 = _train(dict(compressor="onebit", fp32_layers=("2",)))
    assert {lr.name: lr.status for lr in opt2.last_report}["2.weight"] == "fp32"
    assert "compressor=OneBit" in repr(opt2)


def test_optimizer_errors():
    model = torch.nn.Linear(2, 2)

    def make(**kw):
        return cpd.APSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kw)
    with pytest.raises(ValueError, match="not both"):
        make(fmt="e5m2", compressor="onebit")
    with pytest.raises(ValueError, match="scaling='aps'"):
        make(compressor="onebit", scaling="aps")
    with pytest.raises(ValueError, match="algorithm"):
        make(compressor="onebit", algorithm="tree")
    with pytest.raises(ValueError, match="kahan and rounding"):
        make(compressor="onebit", kahan=True)
    with pytest.raises(TypeError, match="fmt is required"):
        make()
    with pytest.raises(ValueError, match="unknown"):
        make(compressor="twobit")
    assert make(fmt="e5m2").scaling == "aps"       # the fmt path's default is unchanged


def test_demo_compressor_runs(capsys, tmp_path):
    from cpd.demo import main, setup_parser

    p = argparse.ArgumentParser()
    setup_parser(p)
    args = p.parse_args(["--fast", "--epochs", "1", "--no-plot", "--compressor", "dynamic_tree",
                         "--compressor", "threshold:0.01", "--out", str(tmp_path)])
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "dynamic_tree" in out and "threshold" in out and "fp32_bytes" in out
    row = next(ln.split() for ln in out.splitlines() if ln.startswith("dynamic_tree") and "%" in ln and
               len(ln.split()) == 5)
    assert float(row[-1]) > 2        # 8-bit codes: about 4x fewer bytes than float32, minus the small chunks
    with pytest.raises(SystemExit, match="--compressor"):
        main(p.parse_args(["--fast", "--compressor", "twobit"]))


def test_optimizer_state_dict_keeps_residuals():
    model, opt = _train(dict(compressor="onebit"))
    sd = opt.state_dict()
    model2, opt2 = _train(dict(compressor="onebit"), steps=1)
    opt2.load_state_dict(sd)
    for n, states in opt.compressor_states.items():
        assert all(torch.equal(a.residual, b.residual) for a, b in zip(states, opt2.compressor_states[n]))


# ------------------------------------------------------------------ the public compressor protocol
def test_error_feedback_helper_is_what_encode_does():
    """ErrorFeedback is the one error-feedback step: encode(x, state) == encode_raw(ef.value) with
    the residual v64 - decode(payload), exactly (rational arithmetic)."""
    from cpd.compressors import ErrorFeedback

    comp = cpd.compressors.get("onebit")
    g1, g2 = torch.randn(6, 5, generator=torch.Generator().manual_seed(3)), torch.randn(6, 5)
    s_ref, s_new = CompressorState(), CompressorState()
    for g in (g1, g2):
        p_ref = comp.encode(g, s_ref)
        ef = ErrorFeedback(g, s_new)
        p_new = comp.encode_raw(ef.value)
        ef.commit(comp.decode_raw(p_new))
        assert all(torch.equal(p_ref.parts[k], p_new.parts[k]) for k in p_ref.parts)
        assert torch.equal(s_ref.residual, s_new.residual) and s_ref.steps == s_new.steps
    sent = comp.decode(p_new)   # what was sent + the new residual == g + the old residual, exactly
    assert [Fraction(a) + Fraction(b) for a, b in zip(sent.reshape(-1).tolist(), s_new.residual.reshape(-1).tolist())] \
        == [Fraction(a) for a in ef.v64.reshape(-1).tolist()]
    # Without a state: the value is g itself and commit does nothing; enabled=True defers the state.
    off = ErrorFeedback(g1)
    assert not off.active and torch.equal(off.value, g1)
    off.commit(torch.zeros_like(g1))
    late = ErrorFeedback(g1, enabled=True)
    assert late.active and torch.equal(late.v64, g1.double())
    with pytest.raises(ValueError, match="CompressorState"):
        late.commit(g1)
    st = CompressorState()
    late.commit(torch.zeros_like(g1), st)
    assert torch.equal(st.residual, g1.double())
    with pytest.raises(TypeError, match="state must be"):
        ErrorFeedback(g1, "nope")
