"""deploy/Dockerfile, checked without a Docker engine: stages, user, entrypoint, the torch
pin, and a build context (.dockerignore) that holds everything the build copies."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

import pytest

from tests.deploy.k8s import ROOT

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
BUILD_TOOLS = ("gcc", "g++", "build-essential", "make", "cmake", "clang", "git")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")),
    )
    out = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def stages() -> list[Stage]:
    found: list[Stage] = []
    for keyword, arg in instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", arg, re.IGNORECASE)
            assert match, arg
            found.append(Stage(match.group(2) or str(len(found)), match.group(1)))
        elif found:
            found[-1].instructions.append((keyword, arg))
    return found


def ignored(path: str) -> bool:
    """Docker's rule: the last .dockerignore pattern that matches decides."""
    verdict = False
    for line in DOCKERIGNORE.read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if pattern.startswith("**/"):
            tail = pattern[3:]
            hit = any(fnmatch.fnmatch(p, tail) for p in parts)
        else:
            hit = any(fnmatch.fnmatch(p, pattern) for p in prefixes)
        if hit:
            verdict = not negate
    return verdict


def test_multi_stage_with_a_clean_non_root_runtime():
    all_stages = stages()
    assert len(all_stages) >= 2, "build and runtime are separate stages"
    runtime = all_stages[-1]
    build = all_stages[0]
    assert runtime.base == build.base, "the venv is copied between identical Python bases"
    copies = runtime.all("COPY")
    assert any(c.startswith("--from=") and "/opt/venv" in c for c in copies)
    assert not any("--from" not in c for c in copies), "runtime copies only the built venv"
    (user,) = runtime.all("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"numeric non-root USER (runAsNonRoot): {user}"
    runs = " ".join(runtime.all("RUN"))
    for tool in BUILD_TOOLS:
        assert not re.search(rf"(?<![\w-]){re.escape(tool)}(?![\w-])", runs), tool
    assert "apt-get install" not in runs
    assert runtime.all("ENTRYPOINT") == ['["tessera"]']


def test_torch_comes_from_the_chosen_index_at_the_pinned_version():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG TORCH_VARIANT=cpu$", text, re.MULTILINE)
    assert "download.pytorch.org/whl/${TORCH_VARIANT}" in text
    (torch_install,) = [
        arg for kw, arg in instructions(text) if kw == "RUN" and "--index-url" in arg
    ]
    assert "-c constraints.txt" in torch_install and re.search(r"\btorch\b", torch_install)
    assert re.search(r"\btorchvision\b", torch_install), "torchvision from the same index"
    constraints = (ROOT / "constraints.txt").read_text()
    pins = re.findall(r"^torch==(\S+)$", constraints, re.MULTILINE)
    assert pins == ["2.14.1"], "constraints.txt pins the torch the image installs"
    vision_pins = re.findall(r"^torchvision==(\S+)$", constraints, re.MULTILINE)
    assert vision_pins == ["0.29.1"], "and the torchvision built for it"
    project_install = [
        arg for kw, arg in instructions(text) if kw == "RUN" and "pip install" in arg
    ][-1]
    assert "-c constraints.txt" in project_install


def test_writable_locations_match_the_manifests():
    """The image sends caches to /cache and /tmp: the emptyDirs the pods mount."""
    env = " ".join(arg for kw, arg in instructions(DOCKERFILE.read_text()) if kw == "ENV")
    for setting in ("HF_HOME=/cache/", "TESSERA_HOME=/cache/", "XDG_CACHE_HOME=/cache"):
        assert setting in env
    assert "PYTHONDONTWRITEBYTECODE=1" in env


def copied_sources() -> list[str]:
    sources = []
    for stage in stages():
        for arg in stage.all("COPY"):
            if arg.startswith("--from"):
                continue
            *srcs, _dest = arg.split()
            sources += srcs
    return sources


@pytest.mark.parametrize("source", copied_sources())
def test_everything_copied_exists_and_is_in_the_build_context(source: str):
    assert (ROOT / source).exists(), source
    assert not ignored(source), f".dockerignore keeps {source} out of the build context"
    if (ROOT / source).is_dir():
        files = [p for p in (ROOT / source).rglob("*.py") if "__pycache__" not in p.parts]
        assert files and not any(ignored(str(p.relative_to(ROOT))) for p in files)


def test_the_copied_files_are_what_pip_needs_to_build_the_project():
    project = (ROOT / "pyproject.toml").read_text()
    copied = set(copied_sources())
    (readme,) = re.findall(r'^readme = "([^"]+)"', project, re.MULTILINE)
    assert readme in copied, "pip reads the readme named in pyproject.toml"
    assert {"pyproject.toml", "constraints.txt"} <= copied
    (include,) = re.findall(r"^include = \[([^\]]*)\]", project, re.MULTILINE)
    packages = re.findall(r'"([^"]+)"', include)
    assert packages
    for pattern in packages:
        top = pattern.rstrip("*")
        assert top in copied, f"package {pattern} is not copied into the image"


def test_dockerignore_keeps_the_heavy_and_private_things_out():
    for path in (".venv/bin/python", ".git/config", "tests/conftest.py", "benchmarks/run.py"):
        assert ignored(path), path
    for path in ("tessera/__pycache__/cli.cpython-311.pyc", "tessera.egg-info/PKG-INFO"):
        assert ignored(path), path
    assert not ignored("tessera/cli.py")
