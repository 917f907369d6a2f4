import pytest
import torch

# Files that take the longest (ranks started as processes, compilers, venvs): scheduled first, so that with one
# worker per core (pytest-xdist, --dist loadfile) no long file starts last and runs alone at the end.
_LONG_FIRST = ("tests/distributed/", "tests/launcher/test_launcher_multinode.py", "tests/test_cuda_build.py",
               "tests/test_cuda_emulator.py", "tests/test_cxx_kernels.py", "tests/test_packaging.py",
               "tests/test_alias_install.py")


def _long_rank(item):
    path = item.nodeid.split("::", 1)[0]
    return next((i for i, prefix in enumerate(_LONG_FIRST) if path.startswith(prefix)), len(_LONG_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_long_rank)   # stable: the order within a file and among the rest is kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_process_group_left_behind():
    """A process group a test leaves behind (dsfast.initialize without dist_init_required=False makes a world of
    one, as DeepSpeed's does; eleven tests do) is destroyed after it: otherwise the tests that start their own world
    (test_comm_api, test_transport_gather) skip on whichever xdist worker runs them next, 86-96 skips between runs."""
    import torch.distributed as dist
    before = dist.is_available() and dist.is_initialized()
    yield
    if dist.is_available() and dist.is_initialized() and not before:
        dist.destroy_process_group()
