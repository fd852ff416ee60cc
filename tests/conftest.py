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
TESTS_DIR = Path(__file__).parent
SERVER_TEST_DIRS = (TESTS_DIR / "integration", TESTS_DIR / "cluster")
DEFAULT_SERVER_TEST_TIMEOUT_S = 120


# Under pytest-xdist (scripts/test.sh runs `-n 2 --dist loadgroup`) a test module is one unit of work, so its
# module-scoped fixtures (a broker, a cluster) start once; the containers and Spark tests are one unit
# together: they share the Docker engine and build cache and the Spark cluster, and two such heavy runs at once
# would only slow each other down. Ports never collide between workers: zk_server.port_slice.
# The units are made by the scheduler below from each test's file, not by xdist_group marks: xdist 3.8 applies
# those by rewriting item._nodeid, which pytest 9.2 no longer reads (every test became its own unit).
HEAVY_TEST_DIRS = {TESTS_DIR / "containers": "containers-and-spark", TESTS_DIR / "spark": "containers-and-spark"}


def work_unit_of(path: Path) -> str:
    """The unit of work of the test file at ``path`` (absolute): its heavy group, else the file itself."""
    for directory, group in HEAVY_TEST_DIRS.items():
        if directory in path.parents:
            return group
    return str(path)


def pytest_collection_modifyitems(config, items):
    for item in items:
        parents = Path(item.fspath).parents
        if any(d in parents for d in SERVER_TEST_DIRS) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_SERVER_TEST_TIMEOUT_S))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without it installed, never called
def pytest_xdist_make_scheduler(config, log):
    """With `--dist loadgroup`: xdist's scope scheduling (largest units first), a unit being work_unit_of the
    test's file."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit_of(config.rootpath / nodeid.split("::", 1)[0])

    return ModuleUnits(config, log)
