"""Compiling the C kernels: once per source, compiler and CPU, into a cache directory, written
to a temporary name and renamed (processes that start together never load a half-written
file)."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("engine.cpu_kernels")

SOURCES = tuple(
    Path(__file__).with_name(n)
    for n in (
        "paged_attention.c",
        "prefill_attention.c",
        "fused_ops.c",
        "linear.c",
        "sampling.c",
        "moe.c",
        "mxfp4.c",
        "quant_linear.c",
        "quant_int8.c",
        "quant_int8_gemm.c",
        "quant_int8_amx.c",
        "quant_prefill.c",
        "quant_amx.c",
        "quant_amx_bf16.c",
        "prefill_attention_amx.c",
        "lora.c",
        "mla_attention.c",
    )
)
HEADERS = tuple(
    Path(__file__).with_name(n)
    for n in (
        "vec8.h",
        "vecw.h",
        "linear.h",
        "amx.h",
        "quant_dequant.h",
        "moe.h",
        "quant_int8.h",
        "cache_sizes.h",
    )
)
CACHE_ENV = "SPLITSERVE_KERNEL_CACHE"
# 8 or 16: build the kernels for that vector width instead of the machine's (vecw.h); the tests
# use it to run the other width's code on any machine.
WIDTH_ENV = "SPLITSERVE_CPU_VEC_WIDTH"
# "1": build the AMX-int8 kernel with its tile instructions done in C (quant_int8_amx.c), so
# the tests run its logic on a host without AMX. Never for serving: the emulation is slow.
AMX_EMULATE_ENV = "SPLITSERVE_AMX_EMULATE"
CACHE_SYSFS = "/sys/devices/system/cpu/cpu0/cache"
_BASE_FLAGS = (
    "-O3",
    "-std=gnu11",
    "-ffp-contract=fast",
    "-fPIC",
    "-shared",
    "-fopenmp",
    "-Wno-psabi",
)


# A loaded 2-core machine took over 120 s for one build; past this the build has failed.
COMPILE_TIMEOUT_S = 900


class KernelBuildError(RuntimeError):
    """The C compiler is missing or failed; the message names the command and its output."""


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "splitserve" / "kernels"


def build(cache_dir: Path | None = None) -> Path:
    """Path of the compiled library for this machine, compiling it first if needed."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise KernelBuildError("no C compiler found (set CC, or install gcc)")
    source = b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS))
    errors = []
    base = _BASE_FLAGS + _width_flags() + _emulate_flags() + cache_flags()
    for flags in (base + ("-march=native",), base):
        target = (cache_dir or default_cache_dir()) / f"splitserve_cpu-{_key(cc, flags, source)}.so"
        if target.exists():
            return target
        try:
            _compile(cc, flags, target)
            return target
        except KernelBuildError as exc:
            errors.append(str(exc))
    raise KernelBuildError("; ".join(errors))


def _width_flags() -> tuple[str, ...]:
    width = os.environ.get(WIDTH_ENV, "").strip()
    if not width:
        return ()
    if width not in ("8", "16"):
        raise KernelBuildError(f"{WIDTH_ENV}={width!r}: the vector width must be 8 or 16")
    if width == "8" and platform.machine().lower() in ("x86_64", "amd64"):
        # the code an AVX2 host builds, on any x86 host: no AVX-512 instruction, 16 vector
        # registers (with AVX-512VL the compiler would use 32 and hide an AVX2 spill)
        return (f"-DSPLITSERVE_VEC_WIDTH={width}", "-mno-avx512f")
    return (f"-DSPLITSERVE_VEC_WIDTH={width}",)


def _emulate_flags() -> tuple[str, ...]:
    told = os.environ.get(AMX_EMULATE_ENV, "").strip()
    if not told:
        return ()
    if told != "1":
        raise KernelBuildError(f"{AMX_EMULATE_ENV}={told!r}: must be 1 (or unset)")
    return ("-DSPLITSERVE_AMX_INT8_EMULATE=1",)


def cache_flags() -> tuple[str, ...]:
    """The host's L1 data and L2 cache sizes as defines (quant_prefill.c's blocks); none
    where the host does not say (the source's defaults then)."""
    sizes = host_cache_bytes()
    return tuple(
        f"-DSPLITSERVE_{name}_BYTES={sizes[name]}" for name in ("L1D", "L2") if name in sizes
    )


def host_cache_bytes() -> dict[str, int]:
    """``L1D`` and ``L2`` (bytes a core) from sysfs, else from getconf; those found."""
    found: dict[str, int] = {}
    for index in sorted(Path(CACHE_SYSFS).glob("index*")):
        try:
            level, kind = (index / "level").read_text().strip(), (index / "type").read_text()
            size = _size_bytes((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        name = {("1", "Data"): "L1D", ("2", "Unified"): "L2"}.get((level, kind.strip()))
        if name and size > 0:
            found.setdefault(name, size)
    for name, key in (("L1D", "LEVEL1_DCACHE_SIZE"), ("L2", "LEVEL2_CACHE_SIZE")):
        if name not in found and (size := _getconf(key)) > 0:
            found[name] = size
    return found


def _size_bytes(text: str) -> int:
    """sysfs sizes: ``32K``, ``1024K``, ``2M`` or plain bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1:].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def _getconf(key: str) -> int:
    try:
        done = subprocess.run(["getconf", key], capture_output=True, text=True, timeout=30)
        return int(done.stdout.strip() or 0) if done.returncode == 0 else 0
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


def _compile(cc: str, flags: tuple[str, ...], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cc, *flags, "-o", tmp, *map(str, SOURCES), "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            shown = " ".join(cmd[: 1 + len(flags)])
            raise KernelBuildError(f"{shown} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)
        log.info("cpu_kernels_built path=%s", target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildError(f"{cc}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _key(cc: str, flags: tuple[str, ...], source: bytes) -> str:
    """Hash of everything the binary depends on: source, flags, compiler and this CPU."""
    h = hashlib.sha256(source)
    h.update(" ".join((cc, *flags, platform.machine())).encode())
    h.update(_compiler_version(cc).encode())
    h.update(_cpu_identity().encode())
    return h.hexdigest()[:16]


@functools.cache
def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _cpu_identity() -> str:
    """Model name and feature flags of the first CPU (``-march=native`` builds for them)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(line for line in text.split("\n\n")[0].splitlines() if line.startswith(wanted))
