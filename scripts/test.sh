#!/usr/bin/env bash
# The whole test command: install everything the tests need (Debian packages, Python packages, npm
# packages), then run the full pytest suite. .ci/run calls exactly this; the README's second command too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
exec python3 -m pytest -q -p no:cacheprovider "$@"
