"""The container images: read the Dockerfiles (no docker daemon here) and check what the chart
relies on: the package and the pinned torch installed, a non-root user matching the chart's
runAsUser, `splitserve` as the entrypoint, and a build context that carries the packages."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib

import pytest
import yaml
from helm_render import CHART, ROOT

DOCKERFILES = {"gpu": ROOT / "docker" / "Dockerfile", "cpu": ROOT / "docker" / "Dockerfile.cpu"}
Instruction = tuple[str, str]


def _instructions(kind: str) -> list[Instruction]:
    """(KEYWORD, rest) per instruction, continuation lines joined, comments dropped."""
    lines = [
        ln for ln in DOCKERFILES[kind].read_text().splitlines() if not ln.lstrip().startswith("#")
    ]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _args(kind: str) -> dict[str, str]:
    return dict(
        rest.split("=", 1)
        for keyword, rest in _instructions(kind)
        if keyword == "ARG" and "=" in rest
    )


def _expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)


def _runs(kind: str) -> str:
    return "\n".join(_expand(rest, _args(kind)) for k, rest in _instructions(kind) if k == "RUN")


def _pinned_torch() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if d.startswith("torch==")]
    return pin.split("==")[1]


def _chart_values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


@pytest.mark.parametrize(
    ("kind", "base"),
    [("gpu", r"nvidia/cuda:12\.[\d.]+-(cudnn-)?runtime-ubuntu"), ("cpu", r"python:3\.11")],
)
def test_base_image(kind: str, base: str) -> None:
    (image,) = [_expand(rest, _args(kind)) for k, rest in _instructions(kind) if k == "FROM"]
    assert re.match(base, image), image
    if kind == "gpu":
        assert "python3.11" in _runs(kind)


@pytest.mark.parametrize(("kind", "index"), [("gpu", "/whl/cu12"), ("cpu", "/whl/cpu")])
def test_installs_pinned_torch_then_the_package(kind: str, index: str) -> None:
    runs = _runs(kind)
    torch = re.search(r'pip install --index-url "?(\S+?)"? "?torch==([\w.]+)', runs)
    assert torch, runs
    assert index in torch.group(1)
    assert torch.group(2) == _pinned_torch()
    assert re.search(r'--mount=type=bind,source=\.,target=(\S+?),rw\s+pip install "?\1\b', runs)
    assert runs.index("torch==") < runs.index("/tmp/src")


def test_gpu_image_nixl_matches_its_torch_cuda() -> None:
    """The NIXL extra, the torch index and the base image name one CUDA major version; the
    build loads NIXL, which refuses a mismatch (kv_transfer/nixl_loader.py)."""
    args = _args("gpu")
    torch_major = re.search(r"/whl/cu(\d\d)\d$", args["TORCH_INDEX_URL"]).group(1)
    image_major = re.search(r"nvidia/cuda:(\d+)\.", args["CUDA_IMAGE"]).group(1)
    extra = args["CUDA_EXTRA"]
    assert extra == f"cuda{torch_major}" and image_major == torch_major
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (nixl,) = extras["optional-dependencies"][extra]
    assert nixl.startswith(f"nixl-cu{torch_major}==")
    runs = _runs("gpu")
    assert f'pip install "/tmp/src[{extra}]"' in runs and "load_nixl()" in runs


@pytest.mark.parametrize("kind", list(DOCKERFILES))
def test_runs_as_the_charts_non_root_user(kind: str) -> None:
    users = [rest for k, rest in _instructions(kind) if k == "USER"]
    assert users, "no USER instruction: the image would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric non-root uid, so runAsNonRoot can check it"
    pod = _chart_values()["podSecurityContext"]
    assert (int(uid), int(gid)) == (pod["runAsUser"], pod["runAsGroup"])


@pytest.mark.parametrize("kind", list(DOCKERFILES))
def test_entrypoint_is_splitserve(kind: str) -> None:
    (entry,) = [rest for k, rest in _instructions(kind) if k == "ENTRYPOINT"]
    assert json.loads(entry) == ["splitserve"]
    exposed = {int(p) for k, rest in _instructions(kind) if k == "EXPOSE" for p in rest.split()}
    values = _chart_values()
    chart_ports = {values["router"]["port"], values["planner"]["port"]} | {
        values[pool][key] for pool in ("prefill", "decode") for key in ("httpPort", "transferPort")
    }
    assert chart_ports <= exposed


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.lstrip("!").rstrip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, pattern[3:]) for part in path.split("/"))
        else:
            hit = fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/")
        if hit:
            ignored = not negate
    return ignored


def test_build_context_carries_the_packages_only() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = [p.rstrip("*") for p in setuptools["packages"]["find"]["include"]]
    for package in packages:
        assert not _ignored(f"{package}/__init__.py", patterns), package
    assert not _ignored("pyproject.toml", patterns)
    for heavy in (
        "tests/conftest.py",
        "helm/splitserve/Chart.yaml",
        ".git/HEAD",
        "engine/__pycache__/x.pyc",
    ):
        assert _ignored(heavy, patterns), heavy
