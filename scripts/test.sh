#!/usr/bin/env bash
# The whole test command: install everything the tests need (Debian packages, Python packages, npm
# packages), then run the full pytest suite. .ci/run calls exactly this; the README's second command too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
# Bytecode once, even where PYTHONDONTWRITEBYTECODE is set: every test broker then starts without
# compiling the package again (a pip-installed broker has its bytecode anyway).
python3 -m compileall -q pykbroker
exec python3 -m pytest -q -p no:cacheprovider "$@"
