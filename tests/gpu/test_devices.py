"""``relayrl.devices.upload`` queues its copy behind the GPU's work instead of waiting for it, a
strided view (a sliced mask, as SFT's) included: the host is back while a long kernel still runs.

Run with ``make test-gpu``; skipped without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relayrl.devices import upload

pytestmark = pytest.mark.gpu

# About half a second of a GPU's clock: far longer than any copy below takes to be queued.
SLEEP_CYCLES = 1_000_000_000


@pytest.mark.parametrize(
    "host",
    [
        np.arange(4096, dtype=np.int64).reshape(64, 64),
        torch.arange(4096, dtype=torch.float32).reshape(64, 64),
        torch.ones(64, 65, dtype=torch.float32)[:, 1:],
        torch.arange(4096, dtype=torch.int64).reshape(64, 64).t(),
    ],
    ids=["numpy", "tensor", "sliced", "transposed"],
)
def test_an_upload_does_not_wait_for_the_kernels_in_flight(host):
    device = torch.device("cuda")
    stream = torch.cuda.current_stream()
    # Once first, so the pinned block comes from torch's cache: allocating page-locked memory is itself
    # a point where the device's streams are drained.
    upload(host, device)
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    uploaded = upload(host, device)
    # A wait for the stream (a copy from pageable memory) would have drained the sleeping kernel.
    assert not stream.query()
    expected = torch.from_numpy(host) if isinstance(host, np.ndarray) else host
    assert torch.equal(uploaded.cpu(), expected)
