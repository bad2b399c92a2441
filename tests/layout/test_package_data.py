"""What a non-editable install needs besides the modules is declared as package data.

(Checked by hand on 2026-12-02: `pip wheel .` then `pip install --target` of the wheel, and
`fluidpd.profiles.resolve_profile('llama-3.1-8b', 'h200', None)` from outside the checkout.)
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from fluidpd.profiles import SHIPPED_PROFILES, available_profiles

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_profile_is_package_data() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = data["package-data"]["fluidpd"]
    files = sorted(p.relative_to(ROOT / "fluidpd").as_posix() for p in SHIPPED_PROFILES.iterdir())
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), files
    assert SHIPPED_PROFILES.is_relative_to(ROOT / "fluidpd")  # inside the package


def test_the_repository_path_leads_to_the_shipped_profiles() -> None:
    assert (ROOT / "profiles").resolve() == SHIPPED_PROFILES
    assert "llama-3.1-8b-h200" in available_profiles()
