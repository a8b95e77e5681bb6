import pytest


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: one thread is as fast and immune to oversubscription on a shared machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
