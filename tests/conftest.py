import pathlib

import pytest

E2E = pathlib.Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items):
    for item in items:
        if E2E in pathlib.Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)
    # The chaos test kills parts of the session's service: the others run before it.
    items.sort(key=lambda item: pathlib.Path(item.fspath) == E2E / "test_chaos.py")
