"""Shared pytest setup for the whole suite (unit and integration).

Tests import `pykbroker` from this checkout, whether or not it is pip-installed: the repo root goes first
on sys.path, so a stale installed copy can never be what the tests exercise.
"""

import sys
from pathlib import Path

import pytest

# pytest's own fixture for running test files in a pytest subprocess (tests/plugin/)
pytest_plugins = ("pytester",)

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# Tests that start servers (brokers, ZooKeeper, Kafka): a hung client or server must fail the test, not
# the CI run. Tests and modules may set their own timeout.
SERVER_TEST_DIRS = (Path(__file__).parent / "integration", Path(__file__).parent / "cluster")
DEFAULT_SERVER_TEST_TIMEOUT_S = 120


# Under pytest-xdist (scripts/test.sh runs `-n 2 --dist loadgroup`) a test module is one unit of work, so its
# module-scoped fixtures (a broker, a cluster) start once; the containers and Spark tests are one unit
# together: they share the Docker engine and build cache and the Spark cluster, and two such heavy runs at once
# would only slow each other down. Ports never collide between workers: zk_server.port_slice.
HEAVY_TEST_DIRS = {Path(__file__).parent / "containers": "containers-and-spark",
                   Path(__file__).parent / "spark": "containers-and-spark"}


def xdist_group_of(path: Path) -> str:
    for directory, group in HEAVY_TEST_DIRS.items():
        if directory in path.parents:
            return group
    return str(path.relative_to(Path(__file__).parent))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the xdist_group marks into work units
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.fspath)
        parents = path.parents
        if any(d in parents for d in SERVER_TEST_DIRS) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_SERVER_TEST_TIMEOUT_S))
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(path)))
