"""One training step of a Hugging Face GPT-2 (2 layers, width 128, batch 4, sequence 64, built
from a config: no download) converted by ``cpd.nn.convert(mul=E4M3, acc=FP16)`` with its
attention GEMMs under ``cpd.nn.emulate`` with the same formats, versus float32, side by side in
one process. Also the step of the original model under ``emulate`` alone (same bits).

    python benchmarks/bench_convert_gpt2.py [--threads 1] [--repeat 5]

Goal (issue 30): the converted step <= 5x float32 on CPU. One thread by default (see
bench_emulate_step.py: on a shared machine two-thread timings of millisecond steps measure the
scheduler).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpd  # noqa: E402
from _timing import median_time  # noqa: E402
from cpd._cpu import machine_line  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    args = p.parse_args()
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

    print(machine_line())
    print(f"{torch.get_num_threads()} threads; GPT-2 2 layers, width {args.width}, vocab {V}, batch {args.batch} x "
          f"{args.seq} tokens; mul=E4M3, acc=FP16 (backward the same)")
    t32 = median_time(lambda: step(model, False), max(args.repeat, 20))
    tc = median_time(lambda: step(conv, True), args.repeat)
    te = median_time(lambda: step(model, True), args.repeat)
    t32 = min(t32, median_time(lambda: step(model, False), max(args.repeat, 20)))
    print(f"float32 step {t32 * 1e3:8.2f} ms")
    print(f"converted + emulate step {tc * 1e3:8.2f} ms   ratio {tc / t32:5.1f}x  (goal <= 5x)")
    print(f"original under emulate step {te * 1e3:8.2f} ms   ratio {te / t32:5.1f}x")


if __name__ == "__main__":
    main()
