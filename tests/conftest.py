import pathlib

import pytest

E2E = pathlib.Path(__file__).parent / "e2e"
# Fixtures of the session's service (tests/e2e/conftest.py) and of the tenancy application
# it starts beside it on first use (tests/e2e/tenancy_app.py).
SESSION_SERVICE, TENANCY_APP = "base_url", "tenancy_url"


def run_order(item) -> int:
    """Tests that need neither run first, on a quiet machine (unit tests; those that start
    services and clusters of their own, each start twice as slow beside the session's idle
    replicas); then those on the session's service; then those that also need the tenancy
    application, whose replicas add to the idle load; the chaos test last, as it kills parts
    of the session's service."""
    if pathlib.Path(item.fspath) == E2E / "test_chaos.py":
        return 3
    if TENANCY_APP in item.fixturenames:
        return 2
    return 1 if SESSION_SERVICE in item.fixturenames else 0


def pytest_collection_modifyitems(items):
    for item in items:
        if E2E in pathlib.Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)
    items.sort(key=run_order)
