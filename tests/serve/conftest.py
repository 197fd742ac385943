"""What the server tests share: a client of the module's `server`, one torch thread."""

import httpx
import pytest
import torch


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture
def one_thread():
    """The server decodes with one torch thread; so does the in-process reference."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
