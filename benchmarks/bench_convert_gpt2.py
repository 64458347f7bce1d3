"""One training step of a Hugging Face GPT-2 (2 layers, width 128, batch 4, sequence 64, built
from a config: no download) converted by ``cpd.nn.convert(mul=E4M3, acc=FP16)`` with its
attention GEMMs under ``cpd.nn.emulate`` with the same formats, versus float32, side by side in
one process. Also the step of the original model under ``emulate`` alone (same bits).

    python benchmarks/bench_convert_gpt2.py [--threads 1] [--repeat 5] [--clock cpu]
    CPD_BENCH_RECORD=1 python benchmarks/bench_convert_gpt2.py --repeat 20 --clock cpu

Goal (issue 30): the converted step <= 5x float32 on CPU. One thread by default (see
bench_emulate_step.py: on a shared machine two-thread timings of millisecond steps measure the
scheduler). The steps are timed in ``repeat`` interleaved rounds (four float32 steps, one of
each other per round) and each one's best time kept; ``--clock cpu`` times CPU seconds of the
process instead of wall seconds (on a machine shared with other work the ratio of CPU times stays
the ratio of work done; with ``--threads 1``). ``CPD_BENCH_RECORD=1`` records the table for
docs/figures.md (benchmarks/_figures.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpd  # noqa: E402
from _figures import Table  # noqa: E402
from cpd._cpu import machine_line  # noqa: E402

CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}


def interleaved_best(fns: list, rounds: int, clock, inner: list[int]) -> list[float]:
    """The best time of each of ``fns`` over ``rounds`` rounds, each round timing ``inner[i]``
    calls of every function one after another (after one warm-up call each): the steps see the
    same load of a shared machine, so a busy spell inflates neither side of the ratio alone."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            for _ in range(inner[i]):
                t = clock()
                fn()
                best[i] = min(best[i], clock() - t)
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--clock", choices=sorted(CLOCK), default="wall", help="wall seconds or process CPU seconds")
    args = p.parse_args()
    clock = CLOCK[args.clock]
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging
    except ImportError:
        raise SystemExit("needs transformers: pip install -e '.[models]'") from None
    logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    V = 512
    cfg = GPT2Config(n_layer=2, n_embd=args.width, n_head=4, vocab_size=V, n_positions=args.seq, bos_token_id=0,
                     eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, V, (args.batch, args.seq))
    fmt = dict(mul=cpd.E4M3, acc=cpd.FP16)
    conv = cpd.nn.convert(model, **fmt)
    assert cpd.nn.conversion_report(conv).unconverted == []

    def step(m, emulated):
        m.zero_grad(set_to_none=True)
        if emulated:
            with cpd.nn.emulate(**fmt):
                loss = m(ids, labels=ids).loss
        else:
            loss = m(ids, labels=ids).loss
        loss.backward()

    tab = Table("bench_convert_gpt2", ["step", "ms", "x float32"], machine=machine_line(),
                title="One training step of a converted Hugging Face GPT-2 (issue 30; goal <= 5x float32)",
                setup=f"{torch.get_num_threads()} threads, {args.clock} clock, best of {args.repeat} interleaved "
                      f"rounds; GPT-2 2 layers, width {args.width}, vocab {V}, batch {args.batch} x {args.seq} "
                      f"tokens; mul=E4M3, acc=FP16 (backward the same)")
    t32, tc, te = interleaved_best([lambda: step(model, False), lambda: step(conv, True), lambda: step(model, True)],
                                   args.repeat, clock, [4, 1, 1])
    tab.row("float32", f"{t32 * 1e3:.2f}", "1.0")
    tab.row("converted + emulate", f"{tc * 1e3:.2f}", f"{tc / t32:.1f}")
    tab.row("original under emulate", f"{te * 1e3:.2f}", f"{te / t32:.1f}")
    tab.save()

if __name__ == "__main__":
    main()
