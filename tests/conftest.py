import os

import pytest
import torch

#: routing reads the built-in cost coefficients, never this machine's `attnkit tune` file (decisions stay the same
#: everywhere; tests of routing decisions pin their own calibration with attnkit.backends.cost.use)
os.environ["ATTNKIT_CALIBRATION"] = "builtin"

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs 2 workers on 2 cores: one thread each, no oversubscription
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
