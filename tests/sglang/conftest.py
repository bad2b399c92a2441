"""Fixtures for the SGLang tests: ``sglang_python``, the interpreter of SGLang's own CPU venv
(``harness.sglang_venv``)."""

from __future__ import annotations

import pytest

from harness import sglang_venv


@pytest.fixture(scope="session")
def sglang_python() -> str:
    return sglang_venv.sglang_python()
