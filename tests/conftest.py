import pathlib

import pytest

E2E = pathlib.Path(__file__).parent / "e2e"
# Tests that bring a Ray cluster of their own: under `pytest -n 2 --dist loadgroup` (make test)
# they run in a second process, beside the one service the other end-to-end tests share.
OWN_CLUSTER = {"test_multinode.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        path = pathlib.Path(item.fspath)
        if E2E in path.parents:
            item.add_marker(pytest.mark.e2e)
            group = "own-cluster" if path.name in OWN_CLUSTER else "session-service"
            item.add_marker(pytest.mark.xdist_group(group))
