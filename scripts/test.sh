#!/usr/bin/env bash
# The whole test command: install everything the tests need (Debian packages, Python packages, npm
# packages), then run the full pytest suite. .ci/run calls exactly this; the README's second command too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
# Bytecode once, even where PYTHONDONTWRITEBYTECODE is set: every test broker then starts without
# compiling the package again (a pip-installed broker has its bytecode anyway).
python3 -m compileall -q pykbroker
# Two pytest-xdist workers: most tests wait on brokers, clients and JVMs, not on the CPU, so two at once
# roughly halve the wall time on 2 cores. Each test module runs whole on one worker (tests/conftest.py);
# ports never collide between workers (zk_server.port_slice). `-n 0` after it runs everything in one process.
exec python3 -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup "$@"
