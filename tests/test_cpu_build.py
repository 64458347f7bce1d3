"""The CPU extension's build choices, testable without the machines they are for (issue 13).

Invariants defended:
* ``build_flags(machine, compiler, arch, openmp)`` gives x86 flags only on x86 (``-march=<level>``
  for the x86-64 levels, ``-march=native`` for the host), Arm flags only on Arm (``-march=armv8.2-a``,
  ``-mcpu=native``; none for Apple clang's native), IEEE flags everywhere (no contraction, no
  fast-math), and OpenMP flags per compiler (``-Xpreprocessor -fopenmp`` + ``-lomp`` for Apple
  clang; none when OpenMP is off);
* a target that does not fit the machine, a bad compiler or a bad ``CPD_CPU_OPENMP`` is a
  ValueError naming the allowed values; a level the host cannot run is refused before it is built;
* the host's level is read off the CPU flags; the module name differs per target and per
  OpenMP setting (separate caches);
* the first build announces itself with one line naming the target; the wire loops keep their
  prefetches;
* a finished library is imported without torch's ``load`` (no ninja run, which would rebuild it
  for a clone at another path: issue 32), beside other loads (a shared flock); one that does not
  import is built again; the module name hashes every file of cuda/ the build includes, so a
  library under a name is always the build of these sources.
"""

import pytest

from cpd import _cpu

IEEE = ["-O3", "-ffp-contract=off", "-fno-fast-math"]
V3_FLAGS = {"sse4_1", "sse4_2", "ssse3", "popcnt", "cx16", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe"}
V4_FLAGS = V3_FLAGS | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize("level", ["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"])
def test_x86_levels(compiler, level):
    f = _cpu.build_flags("x86_64", compiler, level)
    assert f.cflags[:3] == tuple(IEEE) and f"-march={level}" in f.cflags
    assert ("-mprefer-vector-width=512" in f.cflags) == (level == "x86-64-v4")
    assert "-fopenmp" in f.cflags and f.ldflags == ("-fopenmp",) and f.openmp
    assert f.machine == "x86_64" and f.arch == level


def test_x86_native_and_spellings():
    for machine in ("x86_64", "AMD64", "amd64"):
        f = _cpu.build_flags(machine, "gcc")
        assert f.machine == "x86_64" and "-march=native" in f.cflags and "-mprefer-vector-width=512" in f.cflags


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize("machine", ["aarch64", "arm64"])
def test_arm_targets(compiler, machine):
    f = _cpu.build_flags(machine, compiler, "armv8.2-a")
    assert f.machine == "aarch64" and "-march=armv8.2-a" in f.cflags
    assert not any(x.startswith(("-mprefer", "-march=x86", "-mavx")) for x in f.cflags)
    assert "-mcpu=native" in _cpu.build_flags(machine, compiler).cflags
    for arch in ("armv8-a", "armv8.2-a+fp16", "armv9-a", "armv8.4-a+sve"):
        assert f"-march={arch}" in _cpu.build_flags(machine, compiler, arch).cflags


def test_macos_apple_clang():
    f = _cpu.build_flags("arm64", "apple-clang", openmp=False)
    assert f.cflags == tuple(IEEE) and f.ldflags == () and not f.openmp  # no -fopenmp, no -mcpu
    g = _cpu.build_flags("arm64", "apple-clang", openmp=True)
    assert g.cflags == tuple(IEEE + ["-Xpreprocessor", "-fopenmp"]) and g.ldflags == ("-lomp",)
    h = _cpu.build_flags("x86_64", "apple-clang", "x86-64-v3", openmp=False)  # an Intel Mac
    assert "-march=x86-64-v3" in h.cflags and "-fopenmp" not in h.cflags


def test_without_openmp():
    f = _cpu.build_flags("x86_64", "gcc", "x86-64-v2", openmp=False)
    assert "-fopenmp" not in f.cflags and f.ldflags == () and not f.openmp


def test_unknown_machine_native_is_portable():
    f = _cpu.build_flags("ppc64le", "gcc")
    assert f.cflags == tuple(IEEE + ["-fopenmp"])
    with pytest.raises(ValueError, match="ppc64le"):
        _cpu.build_flags("ppc64le", "gcc", "x86-64-v3")


@pytest.mark.parametrize("machine,compiler,arch,match", [
    ("x86_64", "gcc", "armv8.2-a", "not an x86-64 target.*x86-64-v3"),
    ("x86_64", "gcc", "x86-64-v5", "not an x86-64 target"),
    ("aarch64", "gcc", "x86-64-v3", "not an Arm target.*armv8.2-a"),
    ("aarch64", "clang", "armv8.2", "not an Arm target"),
    ("x86_64", "msvc", "native", "compiler must be one of"),
    ("x86_64", "gcc", "", "non-empty"),
])
def test_bad_targets(machine, compiler, arch, match):
    with pytest.raises(ValueError, match=match):
        _cpu.build_flags(machine, compiler, arch)


def test_host_level_from_flags():
    assert _cpu.host_level("x86_64", set()) == "x86-64"
    assert _cpu.host_level("x86_64", V3_FLAGS - {"avx2"}) == "x86-64-v2"
    assert _cpu.host_level("x86_64", V3_FLAGS) == "x86-64-v3"
    assert _cpu.host_level("x86_64", V4_FLAGS) == "x86-64-v4"
    assert _cpu.host_level("x86_64", V4_FLAGS - {"avx2"}) == "x86-64-v2"  # levels are cumulative
    assert _cpu.host_level("aarch64", {"fp", "asimd", "fphp", "asimdhp"}) == "armv8.2-a"


def test_env_validation(monkeypatch):
    monkeypatch.setenv("CPD_CPU_OPENMP", "yes")
    with pytest.raises(ValueError, match="CPD_CPU_OPENMP must be '0', '1' or unset"):
        _cpu.current_flags()
    monkeypatch.setenv("CPD_CPU_OPENMP", "0")
    monkeypatch.setenv("CPD_CPU_ARCH", " x86-64-v2 ")
    if _cpu.machine_kind(__import__("platform").machine()) == "x86_64":
        f = _cpu.current_flags()
        assert f.arch == "x86-64-v2" and not f.openmp


def test_level_the_host_cannot_run_is_refused(monkeypatch):
    monkeypatch.setattr(_cpu, "_cpu_flags", lambda: V3_FLAGS)
    with pytest.raises(ValueError, match="cannot run it.*avx512f.*'x86-64-v3'"):
        _cpu._check_host_runs("x86_64", "x86-64-v4")
    _cpu._check_host_runs("x86_64", "x86-64-v3")  # fine


def test_module_names_differ_per_target():
    names = {_cpu._module_name(_cpu.build_flags("x86_64", "gcc", arch, omp))
             for arch in ("native", "x86-64-v2", "x86-64-v3") for omp in (True, False)}
    assert len(names) == 6


def test_first_build_says_so(monkeypatch, tmp_path, capsys):
    import torch.utils.cpp_extension as ce

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(_cpu, "_state", {})
    monkeypatch.setattr(_cpu, "_openmp_works", lambda flags: True)
    seen = {}

    def fake_load(**kw):
        seen.update(kw)
        return "module"

    monkeypatch.setattr(ce, "load", fake_load)
    flags = _cpu.build_flags("x86_64", "gcc", "x86-64-v2")
    assert _cpu._build(flags) == "module"
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "building cpd's CPU extension for x86-64-v2 (one time, a few minutes)" in err
    assert seen["extra_cflags"] == list(flags.cflags) and str(tmp_path) in seen["build_directory"]
    # once built (the library is in its folder), nothing is printed, and torch's load is not run
    (tmp_path / f"py{__import__('sys').version_info.major}{__import__('sys').version_info.minor}_cpu" /
     seen["name"] / f"{seen['name']}.so").write_bytes(b"")
    monkeypatch.setattr(_cpu, "_import_library", lambda name, folder: "imported")
    monkeypatch.setattr(ce, "load", None)
    assert _cpu._build(flags) == "imported"
    assert capsys.readouterr().err == ""


def test_no_openmp_is_said_and_keyed(monkeypatch, tmp_path, capsys):
    import torch.utils.cpp_extension as ce

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(_cpu, "_state", {})
    monkeypatch.setattr(_cpu, "_openmp_works", lambda flags: False)  # e.g. Apple clang, no libomp
    seen = {}
    monkeypatch.setattr(ce, "load", lambda **kw: seen.update(kw) or "module")
    _cpu._build(_cpu.build_flags("x86_64", "gcc", "x86-64-v3"))
    assert "without OpenMP" in capsys.readouterr().err
    assert "-fopenmp" not in seen["extra_cflags"] and seen["extra_ldflags"] == []
    assert seen["name"] == _cpu._module_name(_cpu.build_flags("x86_64", "gcc", "x86-64-v3", openmp=False))


def test_core_only_build_is_its_own_module(monkeypatch):
    """``_CPD_CPU_CORE_ONLY=1`` (the ISA-level tests) builds cast, arith and matmul only, under a
    module name of its own, so it never shadows or loads the whole extension's library."""
    flags = _cpu.build_flags("x86_64", "gcc", "x86-64-v2")
    whole = _cpu._module_name(flags)
    assert {p.name for p in _cpu._sources()} > set(_cpu.CORE_SOURCES)
    monkeypatch.setenv("_CPD_CPU_CORE_ONLY", "1")
    assert [p.name for p in _cpu._sources()] == list(_cpu.CORE_SOURCES)
    assert _cpu._module_name(flags) != whole


def test_a_killed_build_does_not_hang_the_next(monkeypatch, tmp_path, capsys):
    """torch's ``lock`` file left by a build that was killed (Ctrl-C during the first minute) made
    every later load wait forever; cpd's own flock shows it is stale and removes it."""
    import subprocess
    import sys

    import torch.utils.cpp_extension as ce

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(_cpu, "_state", {})
    monkeypatch.setattr(_cpu, "_openmp_works", lambda flags: True)
    flags = _cpu.build_flags("x86_64", "gcc", "x86-64-v2")
    build_dir = _cpu._build_dir(_cpu._module_name(flags))
    build_dir.mkdir(parents=True)
    (build_dir / "lock").write_bytes(b"")  # the dead build's baton

    def fake_load(**kw):
        assert not (build_dir / "lock").exists()
        assert not _flock_free(build_dir / "cpd.flock")  # held during the build
        return "module"

    def _flock_free(path):
        code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
                "try: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError: sys.exit(1)")
        return subprocess.run([sys.executable, "-c", code, str(path)], timeout=60).returncode == 0

    monkeypatch.setattr(ce, "load", fake_load)
    assert _cpu._build(flags) == "module"
    assert _flock_free(build_dir / "cpd.flock")  # released after the build


def test_sources_include_light_torch_headers():
    """Every first build (a user's, and each ISA level the suite builds) compiles every source:
    torch/extension.h (the whole C++ frontend) takes about 30 s of CPU to parse per file, the
    headers the sources use (ATen/core/Tensor.h, ATen/ops/*.h, torch/library.h, and the pybind
    caster in cast.cpp) about 6. Nothing in cuda/cpu includes it."""
    sources = sorted((_cpu.source_dir() / "cpu").glob("*.*"))
    assert {p.name for p in sources} >= set(_cpu.CORE_SOURCES)
    heavy = [p.name for p in sources if "<torch/extension.h>" in p.read_text()]
    assert heavy == [], heavy


def test_the_hops_prefetch():
    """The wire loops' prefetches of the received bytes survive the compiler (hop.cpp's
    prefetch_block: GCC 12 deleted a loop of nothing but prefetches until an empty asm statement
    kept it). Read off the built library with objdump (x86: prefetcht0 / prefetchw; Arm: prfm)."""
    import platform
    import shutil
    import subprocess

    ext = _cpu.extension()
    objdump = shutil.which("objdump")
    if ext is None or objdump is None or not getattr(ext, "__file__", None):
        pytest.skip("needs the built CPU extension and objdump")
    text = subprocess.run([objdump, "-d", ext.__file__], capture_output=True, text=True, check=True).stdout
    ops = ("prfm",) if platform.machine().lower() in ("aarch64", "arm64") else ("prefetcht0", "prefetchw")
    assert sum(text.count(op) for op in ops) >= 8, "the wire loops' prefetches are gone"


def _copy_of_the_library(tmp_path):
    """A folder holding only a copy of the built library (no build file, no objects), as
    ``TORCH_EXTENSIONS_DIR``; the library's folder there."""
    import shutil
    from pathlib import Path

    ext = _cpu.extension()
    if ext is None or not getattr(ext, "__file__", None):
        pytest.skip("needs the built CPU extension")
    name = Path(ext.__file__).name.split(".")[0]
    folder = tmp_path / Path(ext.__file__).parent.parent.name / name
    folder.mkdir(parents=True)
    shutil.copy2(ext.__file__, folder / Path(ext.__file__).name)
    return folder


def test_a_built_library_is_imported_without_torch_load(tmp_path):
    """The library is loaded as it is, with no ninja run (none could run: the folder has no build
    file), while another process loads it too (a shared flock held here: no wait)."""
    import fcntl
    import os
    import subprocess
    import sys
    from pathlib import Path

    folder = _copy_of_the_library(tmp_path)
    root = Path(__file__).resolve().parent.parent
    code = ("import torch.utils.cpp_extension as ce\n"
            "def no_load(**kw): raise AssertionError(\"torch's load ran\")\n"
            "ce.load = no_load\n"
            "from cpd import _cpu\n"
            "e = _cpu.extension()\n"
            "print(e.__file__, e.isa(), sep='|')\n")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "PYTHONPATH": str(root)}
    env.pop("CPD_NO_EXTENSION", None)
    fd = os.open(folder / "cpd.flock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # another process loading it
        r = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True,
                           timeout=300)
    finally:
        os.close(fd)
    assert r.returncode == 0, r.stderr[-3000:]
    path, isa = r.stdout.strip().splitlines()[-1].split("|")
    assert Path(path).parent == folder and isa == _cpu.extension().isa()
    assert "waiting" not in r.stderr and "building" not in r.stderr, r.stderr[-2000:]
    assert sorted(p.name for p in folder.iterdir()) == sorted([Path(path).name, "cpd.flock"])  # nothing built


def test_a_library_that_does_not_import_is_built_again(monkeypatch, tmp_path, capsys):
    """A library cut short (a killed link) is removed and built again under the exclusive flock."""
    import torch.utils.cpp_extension as ce

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(_cpu, "_state", {})
    flags = _cpu.build_flags("x86_64", "gcc", "x86-64-v2")
    name = _cpu._module_name(flags)
    folder = _cpu._build_dir(name)
    folder.mkdir(parents=True)
    (folder / f"{name}.so").write_bytes(b"\x7fELF cut short")

    def fake_load(**kw):
        assert not (folder / f"{name}.so").exists()
        return "built"

    monkeypatch.setattr(ce, "load", fake_load)
    assert _cpu._build(flags) == "built"
    assert "building cpd's CPU extension for x86-64-v2" in capsys.readouterr().err


def test_module_name_covers_every_file_the_build_includes():
    """A finished library is loaded without asking ninja whether it is up to date, so its name
    must change with every file of cuda/ its build reads: every quoted include of the sources and
    headers resolves to a file the name hashes."""
    import re

    src = _cpu.source_dir()
    hashed = {p.resolve() for p in [*(src / "cpu").glob("*.cpp"), *(src / "cpu").glob("*.h"),
                                    *(src / "include" / "cpd").glob("*.h")]}
    for f in sorted(hashed):
        for inc in re.findall(r'^\s*#\s*include\s*"([^"]+)"', f.read_text(), re.M):
            found = next((c.resolve() for c in (f.parent / inc, src / "include" / inc, src / "cpu" / inc)
                          if c.is_file()), None)
            assert found is not None and found in hashed, f"{f.name} includes {inc!r}, which the module name does not hash"
