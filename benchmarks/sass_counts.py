"""Static instruction counts of the GEMM kernels' inner loops, from the NVRTC cubin (no GPU needed).

    PYTHONPATH=. python benchmarks/sass_counts.py [--arch sm_90]

Compiles ``cuda/kernels/matmul.cu`` with NVRTC (``cpd._cuda.compile_source``, cached), disassembles it
with ``cuobjdump -sass`` (pip: ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``; their
``nvidia/cu13/bin`` is found in site-packages, or on ``PATH``), finds each family kernel's inner loop
(the innermost loop holding a barrier: one full K slice, kk unrolled) and prints its SASS
instructions per multiply-accumulate of one output (loop instructions / (CPD_FK x R x R)), next to
the issue's goals. Nothing is executed: this is the instruction budget a GPU would issue per step,
so a change that bloats a loop shows up on any machine (tests/test_sass_counts.py checks the goals).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: kernel -> (what it runs, MACs of one output per iteration of its inner loop: CPD_FK x R x R,
#: the issue's goal per MAC or None).
#: CPD_FK = 8 (matmul.cu); R = 8 for the chain, 4 for the rounding families. The SR kernel's kk loop
#: is not unrolled (matmul.cu family_gemm), so one iteration of its inner loop is one step of each of
#: its 16 outputs, every variant's code (plain, Kahan, blocks, the exact redo calls) counted.
FAMILIES = {
    "cpd_matmul_chain": ("float32 chain (mul=None, acc=FP32)", 8 * 8 * 8, 1.5),
    "cpd_matmul_lanes16": ("E5M2/E4M3 -> binary16 (5,10)", 8 * 4 * 4, 12.0),
    "cpd_matmul_kahan16": ("Kahan, E5M2/E4M3 -> binary16", 8 * 4 * 4, 30.0),
    "cpd_matmul_lanes": ("other <= 11-bit accumulators", 8 * 4 * 4, None),
    "cpd_matmul_kahan": ("Kahan, other <= 11-bit accumulators", 8 * 4 * 4, None),
    "cpd_matmul_f32": ("E4M3/E5M2/FP16 products -> FP32 (FADD)", 8 * 4 * 4, None),
    "cpd_matmul_kahan32": ("Kahan FP32, rounded products", 8 * 4 * 4, None),
    "cpd_matmul_fkahan32": ("Kahan FP32, mul=None (FFMA, then FADD)", 8 * 4 * 4, None),
    "cpd_matmul_lanesbf": ("E5M2/E4M3 -> BF16", 8 * 4 * 4, None),
    "cpd_matmul_kahanbf": ("Kahan, E5M2/E4M3 -> BF16", 8 * 4 * 4, None),
    "cpd_matmul_fusedbf": ("mul=None -> BF16 (fused, round to odd)", 8 * 4 * 4, None),
    "cpd_matmul_fkahanbf": ("Kahan BF16, mul=None (the issue's row)", 8 * 4 * 4, 30.0),
    "cpd_matmul_fused16": ("mul=None -> FP16 (fused, round to odd)", 8 * 4 * 4, None),
    "cpd_matmul_fkahan16": ("Kahan FP16, mul=None", 8 * 4 * 4, None),
    "cpd_matmul_f32b": ("blocks, E4M3/E5M2/FP16 -> FP32 (Kahan at run ends)", 8 * 4 * 4, None),
    "cpd_matmul_ff32b": ("blocks, mul=None -> FP32", 8 * 4 * 4, None),
    "cpd_matmul_sr": ("stochastic <= 11 bits (all variants, static)", 2 * 2, None),
}

#: The tiled fused-dot kernels (cuda/kernels/fused_dot.cu): family -> (what it runs, L, goal per MAC).
#: Each family is built in its tile shapes (cpd/_tensor_core_op.py TILE_SHAPES, shapes_of: suffix -> (stages,
#: groups per K slice)); their K-slice loop holds nested loops, counted by their trip counts (below).
FUSED_DOT = {
    "cpd_fused_dot_tiled_l32": ("Hopper FP8 model (L 32, F 13, 32-bit sums)", 32, 10.0),
    "cpd_fused_dot_tiled_l16": ("Ada FP8 model (L 16, F 13, 32-bit sums)", 16, None),
    "cpd_fused_dot_tiled_l16w": ("Hopper/Blackwell FP16/BF16 (L 16, F 25, 64-bit sums)", 16, None),
    "cpd_fused_dot_tiled_l32w": ("Blackwell FP8/FP4 (L 32, F 25, 64-bit sums)", 32, None),
    "cpd_fused_dot_tiled_l8": ("Turing/Ampere/Ada FP16/BF16 (L 8, F 24, 32-bit sums)", 8, None),
    "cpd_fused_dot_tiled_l8w": ("Hopper/Blackwell TF32 (L 8, F 25, 64-bit sums)", 8, None),
    "cpd_fused_dot_tiled_l4": ("Volta FP16, Ampere/Ada TF32 (L 4, F 23-24, 32-bit sums)", 4, None),
    "cpd_fused_dot_tiled_l32ws": ("Blackwell MXFP8/6/4 (L 32, F 25, 64-bit, E8M0 scales)", 32, None),
    "cpd_fused_dot_tiled_c16": ("Blackwell NVFP4, MXFP4 x MXFP4 (chunks of 16, L 64, F 35)", 64, None),
    "cpd_fused_dot_tiled_amdp": ("AMD CDNA1 fp16 / bf16 (float32 pairwise sums, L 4)", 4, None),
    "cpd_fused_dot_tiled_amdpz": ("AMD CDNA2 fp16 / bf16 (as CDNA1, subnormals flushed)", 4, None),
    "cpd_fused_dot_tiled_l8a": ("AMD CDNA3 fp16 / bf16 (L 8, F 24, emax of products, RD c)", 8, None),
    "cpd_fused_dot_tiled_l4a": ("AMD CDNA3 xf32 (L 4, F 24, emax of products, RD c)", 4, None),
    "cpd_fused_dot_tiled_l16a": ("AMD CDNA3 fp8 / bf8 (L 16, F 24, even / odd halves, RD c)", 16, None),
}
#: suffix -> (stages, K slice depth): fused_dot.cu CPD_FD_TILED_SHAPES (and cpd/_tensor_core_op.py,
#: whose slice_groups gives the groups of L per slice).
SHAPES = {"s1": (1, 1), "s2": (2, 1), "s2g2": (2, 2)}
TILE_DEPTH = {name: depth for name, (_, depth) in SHAPES.items()}


def pass_chunk(L: int) -> int:
    """k per trip of the passes' loops (fused_dot.cu fd_tiled's C): 8, or L / 2 at L 4 / 8."""
    return L // 2 if L <= 8 else 8
#: The architectures --all-archs prints (each with the shape cpd/_tensor_core_op.py tile_shape picks
#: there by cp.async and the shared memory per block: sm_80/sm_90 163/227 KiB, sm_86/sm_89 99 KiB).
ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100")


def picked_shape(arch: str, L: int, raw: bool = False) -> str:
    """The tile shape cpd/_tensor_core_op.py tile_shape picks for a GPU of ``arch`` and group L
    (``raw``: the raw-element families' (chunk16 with scales per 16, AMD pairwise))."""
    from cpd import _tensor_core_op

    cap = (int(arch[3:-1]), int(arch[-1]))
    return _tensor_core_op.tile_shape(cap, _tensor_core_op._SMEM_OPTIN.get(cap, 48 << 10), L, 16 if raw else 0, raw)

_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_BRA = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")


def tool(name: str) -> str | None:
    """``cuobjdump`` / ``nvdisasm`` from PATH or the pip wheels' nvidia/cu*/bin."""
    found = shutil.which(name)
    if found:
        return found
    import site

    for base in site.getsitepackages() + [site.getusersitepackages()]:
        for p in sorted(Path(base).glob(f"nvidia/cu*/bin/{name}")) + sorted(Path(base).glob(f"nvidia/*/bin/{name}")):
            if os.access(p, os.X_OK):
                return str(p)
    return None


def available() -> bool:
    return tool("cuobjdump") is not None and tool("nvdisasm") is not None


def sass(cubin: bytes) -> dict[str, list[tuple[int, str, str]]]:
    """{function: [(address, opcode, operands)]} of a cubin, by ``cuobjdump -sass``."""
    env = dict(os.environ)
    env["PATH"] = str(Path(tool("nvdisasm")).parent) + os.pathsep + env.get("PATH", "")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([tool("cuobjdump"), "-sass", str(path)], capture_output=True, text=True, check=True,
                              env=env).stdout
    out, cur = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\w+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = _INSN.search(line)
        if m and cur is not None and (m.group(2) or "").strip() != "@!PT":  # @!PT: never issued
            cur.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def loops(insns) -> list[tuple[int, int]]:
    """(first, last) indices of every loop: a backward branch and its target."""
    index = {addr: i for i, (addr, _, _) in enumerate(insns)}
    found = []
    for i, (addr, op, rest) in enumerate(insns):
        m = _BRA.search(op + rest) if op == "BRA" else None
        if m:
            target = int(m.group(1), 16)
            if target <= addr and target in index:
                found.append((index[target], i))
    return found


def inner_loop(insns) -> tuple[int, int]:
    """The K-slice loop: the innermost loop (no other loop inside it) that holds a barrier
    (BAR.SYNC: __syncthreads between slices), the largest if several."""
    ls = [(a, b) for a, b in loops(insns) if any(op.startswith("BAR.") for _, op, _ in insns[a:b + 1])]
    inner = [(a, b) for a, b in ls if not any((a <= c and d <= b) and (c, d) != (a, b) for c, d in ls)]
    return max(inner, key=lambda ab: ab[1] - ab[0])


def counts(arch: str = "sm_90") -> dict[str, dict]:
    """{kernel: {"insns", "macs", "per_mac", "goal", "label", "ops"}} for the family kernels."""
    from cpd import _cuda

    functions = sass(_cuda.compile_source("matmul.cu", arch))
    out = {}
    for name, (label, macs, goal) in FAMILIES.items():
        insns = functions[name]
        a, b = inner_loop(insns)
        body = [op for _, op, _ in insns[a:b + 1] if op != "NOP"]
        ops: dict[str, int] = {}
        for op in body:
            key = op.split(".")[0]
            ops[key] = ops.get(key, 0) + 1
        local = sum(n for op, n in ops.items() if op in ("STL", "LDL"))  # local memory in the loop
        out[name] = {"label": label, "insns": len(body), "macs": macs, "per_mac": len(body) / macs, "goal": goal,
                     "local": local, "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}
    return out


def _loop_count(insns, lo, hi, L, G) -> int:
    """Instructions one thread issues in loop (lo, hi) per trip, loops nested in it times their
    trip counts: the passes over k (innermost, shared loads only, unrolled by 8 or L / 2:
    :func:`pass_chunk`) two or L / 8; a loop
    holding passes is the group loop (G trips); a loop that stores shared memory (staging,
    decomposition, where not unrolled) L / 4; any other loop that reads global memory (fd_step for
    flagged outputs and the rare roundings the 32-bit form leaves: not run on the fast path) 0."""
    def inside(c, d):
        return [(e, f) for e, f in loops(insns) if c <= e and f <= d and (e, f) != (c, d)]

    def ops(c, d):
        return [op for _, op, _ in insns[c:d + 1] if op != "NOP"]

    def is_pass(c, d):
        o = ops(c, d)
        return not inside(c, d) and not any(op.startswith(("LDG", "STS", "LDGSTS")) for op in o)

    nested = inside(lo, hi)
    kids = [(c, d) for c, d in nested if not any(e <= c and d <= f and (e, f) != (c, d) for e, f in nested)]
    total = len(ops(lo, hi)) - sum(len(ops(c, d)) for c, d in kids)
    for c, d in kids:
        o = ops(c, d)
        if any(is_pass(e, f) for e, f in inside(c, d)):
            trips = G
        elif is_pass(c, d):
            trips = L // pass_chunk(L)
        elif any(op.startswith("LDG") and not op.startswith("LDGSTS") for op in o):
            continue
        elif any(op.startswith(("STS", "LDGSTS")) for op in o):
            trips = max(L // 4, 1)
        else:
            trips = L // pass_chunk(L)
        total += trips * _loop_count(insns, c, d, L, G)
    return total


def _c16_count(insns, lo, hi, chunks: int, group_chunks: int = 4) -> float:
    """Instructions one thread of a chunk16 kernel (fused_dot.cu fd_c16_tiled) issues per K slice
    of ``chunks`` chunks of 16 (Blackwell's L 64: ``group_chunks`` 4 chunks a group), on the fast
    path: the slice loop's straight-line code (staging, flags); per chunk, the chunk loop's code up
    to its ``continue`` (the group-start code included: an upper bound, it runs once a group), its
    FMA loop (16 k unrolled by 4: 4 trips) and one trip of the group start's scale-exponent loop
    (a trip per chunk of the group); per group, the code after the ``continue`` (the rounding),
    but for the flagged outputs' loop (fd_chunk16_step from global memory: loops inside it). The
    ``continue`` is the chunk loop's first forward branch past the FMA loop to beyond that loop."""
    def inside(c, d):
        return [(e, f) for e, f in loops(insns) if c <= e and f <= d and (e, f) != (c, d)]

    def direct(c, d):
        nested = inside(c, d)
        return [(e, f) for e, f in nested if not any(g <= e and f <= h and (g, h) != (e, f) for g, h in nested)]

    def ops(c, d):
        return [op for _, op, _ in insns[c:d + 1] if op != "NOP"]

    def flat_count(c, d, kids):
        return sum(1 for i in range(c, d + 1) if insns[i][1] != "NOP" and not any(e <= i <= f for e, f in kids))

    index = {addr: i for i, (addr, _, _) in enumerate(insns)}
    kids = direct(lo, hi)
    total = float(flat_count(lo, hi, kids))
    for c, d in kids:
        sub = direct(c, d)
        fma = [(e, f) for e, f in sub if not inside(e, f) and any(op.startswith("FFMA") for op in ops(e, f))]
        if not fma:
            continue  # not the chunk loop (a staging or flag loop would be counted here: none is built)
        slow = max((ef for ef in sub if inside(*ef)), key=lambda ef: ef[1] - ef[0])
        cont = next(i for i in range(fma[0][1] + 1, d + 1) if insns[i][1] == "BRA"
                    and index.get(int(_BRA.search("BRA" + insns[i][2]).group(1), 16), -1) > slow[1])
        per_chunk = flat_count(c, cont, sub) + 4 * len(ops(*fma[0]))
        per_chunk += sum(len(ops(e, f)) for e, f in sub if (e, f) not in fma and (e, f) != slow and e < cont)
        per_group = flat_count(cont + 1, d, sub)
        total += chunks * per_chunk + chunks / group_chunks * per_group
    return total


def _amdp_count(insns, lo, hi, ks: int) -> int:
    """Instructions one thread of an AMD pairwise kernel (fused_dot.cu fd_amdp_tiled) issues per K
    slice of ``ks`` elements: the slice loop's straight-line code plus its loop over groups of 4 k
    (ks / 4 trips); a loop inside that one would be counted once per trip (none is built)."""
    def inside(c, d):
        return [(e, f) for e, f in loops(insns) if c <= e and f <= d and (e, f) != (c, d)]

    def ops(c, d):
        return [op for _, op, _ in insns[c:d + 1] if op != "NOP"]

    nested = inside(lo, hi)
    kids = [(c, d) for c, d in nested if not any(e <= c and d <= f and (e, f) != (c, d) for e, f in nested)]
    total = len(ops(lo, hi)) - sum(len(ops(c, d)) for c, d in kids)
    for c, d in kids:
        total += (ks // 4 if any(op.startswith("FFMA") for op in ops(c, d)) else 1) * len(ops(c, d))
    return total


def fused_dot_counts(arch: str = "sm_90", shapes=None) -> dict[str, dict]:
    """{kernel: {"insns", "macs", "per_mac", "goal", "label", "shape"}} for the tiled fused-dot
    kernels in each tile shape (default: all): the instructions one thread issues per K slice (G
    groups of L; 4 x 4 outputs, so 16 L G MACs) on the fast path: the slice loop's straight-line
    code plus each loop nested in it times its trip count (:func:`_loop_count`). The straight-line
    code counts every instruction, branches not taken on the fast path included."""
    from cpd import _cuda, _tensor_core_op

    functions = sass(_cuda.compile_source("fused_dot.cu", arch))
    major = int(arch[3:-1])
    out = {}
    for family, (label, L, goal) in FUSED_DOT.items():
        if "_amdp" in family:
            for shape in shapes or SHAPES:
                if shape not in _tensor_core_op.shapes_of(L, 0, major, raw=True):
                    continue
                ks = 32 * TILE_DEPTH[shape]
                insns = functions[f"{family}_{shape}"]
                a, b = inner_loop(insns)
                total = _amdp_count(insns, a, b, ks)
                out[f"{family}_{shape}"] = {"label": label, "insns": total, "macs": 16 * ks,
                                            "per_mac": total / (16 * ks), "goal": goal, "shape": shape}
            continue
        if family.endswith("_c16"):
            for shape in shapes or SHAPES:
                if shape not in _tensor_core_op.shapes_of(L, 16, major, raw=True):
                    continue
                chunks = 2 * TILE_DEPTH[shape]  # K slices of 32 elements per depth
                insns = functions[f"{family}_{shape}"]
                a, b = inner_loop(insns)
                total = round(_c16_count(insns, a, b, chunks))
                macs = 16 * 16 * chunks
                out[f"{family}_{shape}"] = {"label": label, "insns": total, "macs": macs, "per_mac": total / macs,
                                            "goal": goal, "shape": shape}
            continue
        for shape in shapes or SHAPES:
            if shape not in _tensor_core_op.shapes_of(L, 32 if family.endswith("s") else 0, major):
                continue  # not built at this arch (s1 before sm_80; s2: L 32 without scales only)
            G = _tensor_core_op.slice_groups(L, shape)
            insns = functions[f"{family}_{shape}"]
            a, b = inner_loop(insns)
            total = _loop_count(insns, a, b, L, G)
            macs = 16 * L * G
            out[f"{family}_{shape}"] = {"label": label, "insns": total, "macs": macs, "per_mac": total / macs,
                                        "goal": goal, "shape": shape}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--all-archs", action="store_true",
                   help="the tiled fused-dot kernels at every architecture of ARCH_SHAPE too (its shape marked *)")
    args = p.parse_args(argv)
    if not available():
        print("cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
        return 0
    from cpd import _cuda

    if not _cuda.available():
        print("NVRTC (cuda-bindings) not installed")
        return 0
    print(f"SASS per multiply-accumulate of one output, inner loop of matmul.cu at {args.arch}:")
    for name, c in counts(args.arch).items():
        top = ", ".join(f"{k} {v}" for k, v in list(c["ops"].items())[:6])
        print(f"  {name:18s} {c['label']:42s} {c['insns']:5d} / {c['macs']:4d} = {c['per_mac']:6.2f}"
              f"  (goal {'<= ' + str(c['goal']) if c['goal'] else '-'})  [{top}]")
    archs = [args.arch] + ([a for a in ARCHS if a != args.arch and int(a[3:]) in _cuda.supported_archs()]
                           if args.all_archs else [])
    for arch in archs:
        print(f"SASS per multiply-accumulate of one output, tiled fused-dot kernels (fused_dot.cu) at {arch} "
              f"(* the shape picked there):")
        for name, c in fused_dot_counts(arch).items():
            family = name.rsplit("_", 1)[0]
            raw = family.endswith("_c16") or "_amdp" in family
            mark = "*" if picked_shape(arch, FUSED_DOT[family][1], raw) == c["shape"] else " "
            print(f"  {name:31s}{mark} {c['label']:52s} {c['insns']:5d} / {c['macs']:4d} = {c['per_mac']:6.2f}"
                  f"  (goal {'<= ' + str(c['goal']) if c['goal'] else '-'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
