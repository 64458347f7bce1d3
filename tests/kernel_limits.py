"""The GPU kernels' local-memory and register budget, checked by tests/test_cuda.py on ptxas's report
(cpd._cuda.resource_usage)."""

from cpd import _kernels

#: The kernels allowed some local memory (bytes, ptxas's report), and why. Every other kernel has
#: none. (Until 27 Nov the report was read wrong: a kernel's figures were taken from the last
#: "Function properties" line before the next kernel, which is a called function's; that hid these.)
#: * cpd_matmul_sr: a stack frame for its out-of-line exact redo calls (their formats are passed by
#:   reference); no spills, and no local memory in its K loop (tests/test_sass_counts.py).
#: (cpd_matmul_chain spilled 56-328 bytes of staging values with its 8 x 8 tile at 128 registers,
#: until it asked for one block per SM: matmul.cu CPD_FAMILY_KERNEL.)
LOCAL_ALLOWED = {"cpd_matmul_sr": {"stack": 320, "spill": 0}}


def check_local_memory(usage: dict, where) -> None:
    """Every kernel of a ptxas report within LOCAL_ALLOWED (none for the unlisted ones)."""
    assert usage, where
    for name, u in usage.items():
        lim = LOCAL_ALLOWED.get(name, {"stack": 0, "spill": 0})
        assert u["stack"] <= lim["stack"] and max(u["spill_stores"], u["spill_loads"]) <= lim["spill"], (where, name, u)


def check_family_kernels(usage: dict, arch: str, local: bool = True) -> None:
    """matmul.cu's GEMM family kernels in ``usage`` (ptxas's report of the file at ``arch``): at
    most 128 registers (two blocks of 256 per SM; the chain, SR and the blocked float32 families
    one block, 255, and KAHANBF before sm_80), and with ``local`` within LOCAL_ALLOWED."""
    family = {name: usage[name] for name, _ in _kernels.FAMILY_KERNELS.values()}
    if local:
        check_local_memory(family, arch)
    for name, u in family.items():
        one_block = name in ("cpd_matmul_sr", "cpd_matmul_chain", "cpd_matmul_f32b", "cpd_matmul_ff32b") or (
            name == "cpd_matmul_kahanbf" and int(arch[3:]) < 80)
        assert u["registers"] <= (255 if one_block else 128), (arch, name, u)
