import os

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs 2 workers on 2 cores: one thread each, no oversubscription
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
