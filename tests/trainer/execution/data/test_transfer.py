import numpy as np
import pytest
import torch

from trainer.execution.data.transfer import host_into, host_to_device


def test_on_the_cpu_the_tensor_is_the_arrays_own_memory() -> None:
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = host_to_device(host, torch.device("cpu"))
    host[0, 0] = 7.0  # no copy was made: the caller's array is what the replay writes
    assert tensor[0, 0].item() == 7.0 and tensor.dtype == torch.float32 and tensor.shape == (2, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_copy_is_queued_and_outlives_the_hosts_array() -> None:
    device = torch.device("cuda")
    busy = torch.randn(4096, 4096, device=device)
    for _ in range(20):  # a queue of work that a blocking copy would wait for
        busy = busy @ busy / 4096
    hosts = [np.full((3, 5), float(i), dtype=np.float32) for i in range(50)]
    copies = [host_to_device(host, device) for host in hosts]
    for host in hosts:
        host[...] = -1.0  # the copies were taken from pinned buffers, not from these arrays
    torch.cuda.synchronize()
    assert all(torch.equal(copy.cpu(), torch.full((3, 5), float(i))) for i, copy in enumerate(copies))


def test_a_copy_into_a_buffer_takes_the_arrays_values_then() -> None:
    target = torch.zeros(2, 3, dtype=torch.int64)
    host = np.arange(6).reshape(2, 3)
    host_into(target, host)
    host[...] = -1
    assert target.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_copies_into_one_buffer_arrive_in_order_behind_its_readers() -> None:
    """A graph's static buffer refilled each step: each copy lands after the work queued before it read the last."""
    device = torch.device("cuda")
    busy = torch.randn(4096, 4096, device=device)
    target, total = torch.zeros(3, 5, device=device), torch.zeros(3, 5, device=device)
    for i in range(50):
        busy = busy @ busy / 4096  # keeps the queue long, so a copy that jumped it would be seen
        host = np.full((3, 5), float(i), dtype=np.float32)
        host_into(target, host)
        host[...] = -1.0
        total += target
    torch.cuda.synchronize()
    assert torch.equal(total.cpu(), torch.full((3, 5), float(sum(range(50)))))
