"""Engine tests run torch on one thread.

The models are tiny: with two threads on a shared two-core machine, OpenMP
start-up and contention cost several times the arithmetic. Results do not
depend on the thread count (``test_model`` checks that explicitly).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
