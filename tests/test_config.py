"""The frozen reduction configurations (cpd.config) and the leaf helpers (cpd.primitives)."""

import dataclasses
import math
import pickle
from fractions import Fraction

import numpy as np
import pytest
import torch

import cpd
from cpd.config import (AUTO, COMPRESSED_ALGORITHMS, EMULATED_ALGORITHMS, PROCESS_ALGORITHMS, CompressedReduceConfig,
                        ReduceConfig, make_config)
from cpd.primitives import Accumulator, aps_exponent, ceil_log2, chunk_bounds, match_prefix, stack_workers


# ------------------------------------------------------------------------------------ ReduceConfig
def test_defaults_and_parsing():
    c = ReduceConfig("e5m2")
    assert c.fmt == cpd.E5M2 and c.algorithm == "ring" and c.group_size is None and c.kahan is False
    assert c.rounding is cpd.Rounding.NEAREST and c.saturate is False and c.scaling == "aps" and c.margin == 0
    assert c.fp32_layers == () and c.hybrid_steps == 0 and c.workers is None and c.compressor is None
    c = ReduceConfig(cpd.E4M3, "hierarchical", 2, kahan=True, rounding="up", scaling=None, fp32_layers="fc",
                     workers=4)
    assert c.rounding is cpd.Rounding.UP and c.scaling is None and c.fp32_layers == ("fc",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.kahan = False
    assert hash(c) == hash(ReduceConfig(cpd.E4M3, "hierarchical", 2, kahan=True, rounding="up", scaling=None,
                                        fp32_layers=("fc",), workers=4))
    assert c.is_fp32_layer("fc") and c.is_fp32_layer("fc.weight") and not c.is_fp32_layer("fc2.weight")


@pytest.mark.parametrize("kwargs, exc, needle", [
    (dict(fmt="e9m9"), ValueError, "fmt"),
    (dict(algorithm="butterfly"), ValueError, "butterfly"),
    (dict(algorithm="hierarchical"), ValueError, "group_size"),
    (dict(algorithm="hierarchical", group_size=0), ValueError, "group_size=0"),
    (dict(algorithm="hierarchical", group_size=2.0), TypeError, "group_size"),
    (dict(algorithm="hierarchical", group_size=4, workers=6), ValueError, "group_size=4"),
    (dict(group_size=2), ValueError, "group_size only applies"),
    (dict(kahan=1), TypeError, "kahan"),
    (dict(saturate="yes"), TypeError, "saturate"),
    (dict(algorithm="one_rounding", kahan=True), ValueError, "one_rounding"),
    (dict(rounding="sideways"), ValueError, "sideways"),
    (dict(scaling="global"), ValueError, "scaling"),
    (dict(margin=1.5), TypeError, "margin"),
    (dict(fp32_layers=[3]), TypeError, "fp32_layers"),
    (dict(hybrid_steps=-1), ValueError, "hybrid_steps"),
    (dict(workers=0), ValueError, "workers"),
])
def test_reduce_config_errors(kwargs, exc, needle):
    kwargs = {"fmt": "e5m2", **kwargs}
    with pytest.raises(exc) as info:
        ReduceConfig(**kwargs)
    assert needle in str(info.value), str(info.value)


def test_executors_narrow_the_algorithms():
    for a in EMULATED_ALGORITHMS + PROCESS_ALGORITHMS:
        ReduceConfig("e5m2", a, 1 if a == "hierarchical" else None)
    with pytest.raises(ValueError, match="one_rounding"):
        ReduceConfig("e5m2", "one_rounding").require(EMULATED_ALGORITHMS, "the emulator")
    with pytest.raises(ValueError, match="algorithm"):
        ReduceConfig("e5m2", "tree").for_processes()
    with pytest.raises(ValueError, match="stochastic"):
        ReduceConfig("e5m2", rounding="stochastic").for_processes()
    c = ReduceConfig("e5m2", "hierarchical", 2)
    assert c.with_workers(4).workers == 4
    with pytest.raises(ValueError, match="W=3"):
        c.with_workers(3)
    with pytest.raises(ValueError, match="one_rounding"):
        cpd.allreduce(torch.zeros(2, 3), ReduceConfig("e5m2", "one_rounding"))


def test_auto_is_one_sentinel():
    assert repr(AUTO) == "AUTO" and pickle.loads(pickle.dumps(AUTO)) is AUTO
    assert type(AUTO)() is AUTO
    assert ReduceConfig("e5m2", scaling=AUTO).scaling == "aps"


# ------------------------------------------------------------------------------ CompressedReduceConfig
def test_compressed_config():
    c = CompressedReduceConfig("onebit", "pairwise", fp32_layers=["fc"])
    assert isinstance(c.compressor, cpd.compressors.OneBit) and c.algorithm == "pairwise"
    assert c.fmt == cpd.FP32 and c.kahan is False and c.scaling is None and c.group_size is None and c.margin == 0
    assert c.for_processes() is c
    comp = cpd.compressors.Threshold(0.1)
    assert CompressedReduceConfig(comp).compressor is comp
    assert set(COMPRESSED_ALGORITHMS) == {"ring", "pairwise"}
    with pytest.raises(ValueError, match="'ring', 'pairwise'"):
        CompressedReduceConfig("onebit", "tree")
    with pytest.raises(ValueError, match="unknown"):
        CompressedReduceConfig("twobit")
    with pytest.raises(ValueError, match="random"):
        CompressedReduceConfig("adaptive:64:sample=16").for_processes()


# ------------------------------------------------------------------------------------- make_config
def test_make_config():
    assert make_config("e5m2", kahan=True) == ReduceConfig("e5m2", kahan=True)
    assert isinstance(make_config(compressor="onebit", scaling=None, rounding="nearest"), CompressedReduceConfig)
    cfg = ReduceConfig("e4m3")
    assert make_config(cfg) is cfg and make_config(config=cfg, algorithm="ring") is cfg
    with pytest.raises(ValueError, match="not both"):
        make_config("e5m2", compressor="onebit")
    with pytest.raises(ValueError, match="kahan=True"):
        make_config(compressor="onebit", kahan=True)
    with pytest.raises(ValueError, match="kahan and rounding"):
        make_config(compressor="onebit", rounding="up")
    with pytest.raises(ValueError, match="scaling='aps'"):
        make_config(compressor="onebit", scaling="aps")
    with pytest.raises(ValueError, match="generator"):
        make_config(compressor="onebit", fmt_only={"generator": (torch.Generator(), None)})
    with pytest.raises(TypeError, match="fmt is required"):
        make_config(what="allreduce()")
    with pytest.raises(TypeError, match="needs fmt"):
        make_config(what="allreduce()")
    with pytest.raises(ValueError, match="not both"):
        make_config(config=cfg, kahan=True)
    with pytest.raises(TypeError, match="config must be"):
        make_config(config="e5m2")
    with pytest.raises(TypeError, match="unknown options"):
        make_config("e5m2", colour="red")


def test_front_ends_take_a_config():
    x = torch.randn(4, 33, generator=torch.Generator().manual_seed(1))
    cfg = ReduceConfig(cpd.E4M3, "hierarchical", 2, kahan=True, rounding="toward_zero")
    want = cpd.allreduce(x, cpd.E4M3, algorithm="hierarchical", group_size=2, kahan=True, rounding="toward_zero")
    assert torch.equal(cpd.allreduce(x, cfg), want) and torch.equal(cpd.allreduce(x, config=cfg), want)
    layers = {"a": list(x), "fc.weight": list(x * 3)}
    out1, _ = cpd.aps_allreduce(layers, config=ReduceConfig(cpd.E5M2, margin=1, fp32_layers=("fc",)))
    out2, _ = cpd.aps_allreduce(layers, cpd.E5M2, margin=1, fp32_layers=["fc.weight"])
    assert all(torch.equal(out1[k], out2[k]) for k in layers)
    comp = cpd.allreduce(x, CompressedReduceConfig("dynamic_tree"))
    assert torch.equal(comp, cpd.allreduce(x, compressor="dynamic_tree"))
    with pytest.raises(TypeError, match="ReduceConfig"):
        cpd.aps_allreduce(layers, CompressedReduceConfig("onebit"))
    with pytest.raises(ValueError, match="workers=3"):
        cpd.allreduce(x, ReduceConfig(cpd.E5M2, workers=3))


# ------------------------------------------------------------------------------------- primitives
def test_chunk_bounds_is_array_split():
    for n in range(0, 30):
        for parts in range(1, 9):
            got = [b - a for a, b in chunk_bounds(n, parts)]
            assert got == [len(c) for c in np.array_split(np.arange(n), parts)]
            assert chunk_bounds(n, parts)[0][0] == 0 and chunk_bounds(n, parts)[-1][1] == n


def test_ceil_log2_exact():
    for v in list(range(1, 300)) + [2**40, 2**40 + 1]:
        want = next(e for e in range(-1, 80) if 2**e >= v)
        assert ceil_log2(v) == want == ceil_log2(float(v)), v
    for v in (0.3, 1e-40, 2.0**-149, 3.0 * 2**100, 0.5, 0.75):
        f = Fraction(v)
        want = min(e for e in range(-200, 200) if Fraction(2) ** e >= f)
        assert ceil_log2(v) == want, v
    for bad in (0, -1, 0.0, -2.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            ceil_log2(bad)


def test_aps_exponent_and_helpers():
    x = torch.tensor([[0.75, -3.0], [1.0, 0.0]])
    assert aps_exponent(x, cpd.E5M2, 2) == 15 - 3 and aps_exponent(x, cpd.E5M2, 2, 2) == 10
    assert aps_exponent(torch.zeros(2, 3), cpd.E5M2, 2) is None
    assert cpd.aps_exponent is aps_exponent
    assert match_prefix("fc.weight", "fc") and match_prefix("fc", "fc") and not match_prefix("fc2", "fc")
    m, shape = stack_workers([torch.ones(2, 3), torch.zeros(2, 3)])
    assert m.shape == (2, 6) and shape == (2, 3)
    acc = Accumulator(True, cpd.E5M2, cpd.Rounding.NEAREST, False, None)
    s, c = acc.merge(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([2.0**-4]))
    assert s.item() == 1.0 and c.item() == -(2.0**-4)   # the lost addend is kept in the compensation


def test_cost_estimate_is_a_frozen_dataclass():
    est = cpd.cost_model(1000, 8, "ring", alpha=1e-6, beta=1e-9)
    assert dataclasses.is_dataclass(est) and not hasattr(est, "nope") and hasattr(est, "time")
    assert est["time"] == est.time and dict(est)["steps"] == est.steps == 14
    assert set(est.keys()) == {"time", "steps", "bytes_per_worker", "latency", "bandwidth", "compute", "aps_time",
                               "message_bytes"} and est.to_dict() == dict(est)
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.time = 0.0
    with pytest.raises(KeyError):
        est["nope"]


def test_aps_optimizer_takes_a_config():
    def run(**kw):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        opt = cpd.APSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model=model, **kw)
        x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1] * 4)
        for wx, wy in opt.split(x, y):
            torch.nn.functional.cross_entropy(model(wx), wy).backward()
            opt.collect()
        opt.step()
        return opt, [p.detach().clone() for p in model.parameters()]

    o1, p1 = run(config=ReduceConfig(cpd.E4M3, "hierarchical", 2, kahan=True, fp32_layers="2", workers=4))
    o2, p2 = run(fmt=cpd.E4M3, algorithm="hierarchical", group_size=2, kahan=True, fp32_layers=["2"], workers=4)
    assert all(torch.equal(a, b) for a, b in zip(p1, p2)) and o1.config == o2.config and o1.workers == 4
    o3, _ = run(config=CompressedReduceConfig("onebit"), workers=2)
    assert o3.workers == 2 and o3.fmt is None and o3.scaling is None and o3.compressor.name == "onebit"
    assert run(fmt="e5m2")[0].config.workers == 8
    with pytest.raises(ValueError, match="not both"):
        run(config=ReduceConfig(cpd.E4M3), kahan=True)
    with pytest.raises(ValueError, match="W=3"):
        run(config=ReduceConfig(cpd.E4M3, "hierarchical", 2), workers=3)
    with pytest.raises(ValueError, match="one_rounding"):
        run(fmt=cpd.E4M3, algorithm="one_rounding")
