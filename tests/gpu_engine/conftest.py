"""The gpu engine's tests run on CPU with the tiny shapes; they need torch (a dev extra)."""

import pytest

torch = pytest.importorskip("torch")
torch.set_num_threads(1)
