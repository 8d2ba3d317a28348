"""Wheels for a GPU machine that has torch, Triton and transformers but not the rest of what
splitserve and the GPU check need, for a machine with no package index.

    python -m bench.device_wheels [--dest .whl] [--python 3.12]

Writes two folders, each carried in one device call (64 MiB a call with the checkout):
``<dest>/nixl`` holds ``nixl-cu13`` alone (57 MB, for torch built for CUDA 13), and
``<dest>/deps`` every other missing distribution: splitserve's runtime requirements and the
test ones the GPU tests import, with what they require in turn, minus what the machine
already has (``DEVICE_HAS``), each at the version installed here. Prints the command that
installs a folder there. Run it from the checkout, with the project's venv, online.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

CALL_MIB = 64.0  # what one device call carries, checkout included
NIXL = "nixl-cu13"
NIXL_VERSION = "1.5.1"
# What the GPU tests import beyond the runtime requirements.
TEST_ROOTS = ("pytest-asyncio", "openai", "jsonschema")
# Distributions the device image holds already (its package list, README of the device tool).
DEVICE_HAS = frozenset(
    (
        "accelerate",
        "anyio",
        "attrs",
        "certifi",
        "charset-normalizer",
        "click",
        "filelock",
        "fsspec",
        "h11",
        "hf-xet",
        "httpcore",
        "httpx",
        "huggingface-hub",
        "hypothesis",
        "idna",
        "iniconfig",
        "jinja2",
        "markdown-it-py",
        "markupsafe",
        "mdurl",
        "mpmath",
        "networkx",
        "numpy",
        "packaging",
        "peft",
        "pip",
        "pluggy",
        "prometheus-client",
        "psutil",
        "pygments",
        "pytest",
        "pytest-timeout",
        "pyyaml",
        "regex",
        "requests",
        "rich",
        "safetensors",
        "setuptools",
        "shellingham",
        "six",
        "sortedcontainers",
        "sympy",
        "tokenizers",
        "torch",
        "tqdm",
        "transformers",
        "triton",
        "typer",
        "typing-extensions",
        "urllib3",
        "uvloop",
        "nvidia-nccl-cu13",
        "protobuf",
    )
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_24_x86_64", "manylinux_2_5_x86_64")  # fmt: skip
INSTALL = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
    "--target /tmp/site {folder}/*.whl && export PYTHONPATH=/tmp/site:$PWD"
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(dist: str) -> list[str]:
    """Names ``dist`` requires here, its extras and markers that do not apply left out."""
    names = []
    for req in metadata.requires(dist) or []:
        name, _, marker = req.partition(";")
        if "extra ==" in marker or "platform_system == 'Windows'" in marker:
            continue
        names.append(canonical(re.split(r"[\s\[<>=!~(]", name.strip(), maxsplit=1)[0]))
    return names


def missing_on_device(roots: list[str]) -> dict[str, str]:
    """{name: version installed here} for ``roots`` and what they require, minus the device's."""
    wanted: dict[str, str] = {}
    todo = list(roots)
    while todo:
        name = canonical(todo.pop())
        if name in wanted or name in DEVICE_HAS or name.startswith("nixl"):
            continue
        try:
            wanted[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # not needed on this platform (no installed copy to match)
        todo.extend(requirement_names(name))
    return wanted


def download(specs: list[str], folder: Path, python: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp", *platforms, "-d", str(folder),
           *specs]  # fmt: skip
    print(f"downloading {len(specs)} wheels into {folder}", flush=True)
    subprocess.run(cmd, check=True)


def folder_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.glob("*.whl")) / 2**20


def checkout_mib() -> float:
    """What the checkout's tracked files weigh: they travel with every device call."""
    listed = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout
    paths = [Path(p) for p in listed.decode().split("\0") if p]
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.device_wheels", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)  # fmt: skip
    ap.add_argument("--dest", type=Path, default=Path(".whl"))
    ap.add_argument("--python", default="3.12", help="the device's Python (default 3.12)")
    args = ap.parse_args(argv)
    roots = [*requirement_names("splitserve"), *TEST_ROOTS]
    deps = missing_on_device(roots)
    download([f"{NIXL}=={NIXL_VERSION}"], args.dest / "nixl", args.python)
    download([f"{n}=={v}" for n, v in sorted(deps.items())], args.dest / "deps", args.python)
    room = CALL_MIB - checkout_mib()
    for part in ("nixl", "deps"):
        folder = args.dest / part
        size = folder_mib(folder)
        print(f"{folder}: {size:.1f} MiB; there: {INSTALL.format(folder=folder)}")
        if size > room:
            print(f"error: {folder} is over the {room:.1f} MiB a call has beside the checkout")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
