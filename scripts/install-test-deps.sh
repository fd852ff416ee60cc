#!/usr/bin/env bash
# Install everything the test suite needs beyond a Python interpreter, on Debian (as root, or with
# passwordless sudo):
#   - Debian packages: kcat (integration tests), zookeeper (cluster tests; pulls in a Java runtime),
#     chromium (the web console's browser tests), docker.io, debootstrap and docker-compose (the container
#     tests: tests/containers starts dockerd through scripts/docker-engine.sh and builds its base image)
#   - this project in editable mode with its `test` extra (pytest, the Kafka clients, codecs, kazoo)
#   - KafkaJS for the node tests in tests/js
#   - pyspark for tests/spark, pinned to the Kafka connector's minor version (Java from default-jre-headless)
# Idempotent and quiet: it only runs apt-get update when a package is missing and apt does not know it,
# and skips the npm install when the pinned KafkaJS is already there. It never runs the tests.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

say() { printf 'install-test-deps: %s\n' "$*"; }

# --- Debian packages -------------------------------------------------------------------------------
missing=()
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
[ -x /usr/share/zookeeper/bin/zkServer.sh ] || missing+=(zookeeper)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
command -v chromium >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)
# Any dockerd (Docker CE's too: docker.io would conflict with it). On a systemd host, docker.io's service
# starts an engine with a bridge and iptables rules at once; the container tests then use that engine (their
# containers still use host networking) instead of starting their own with --bridge=none --iptables=false.
command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || missing+=(docker.io)
[ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)

if ((${#missing[@]})); then
    if [ "$(id -u)" -eq 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
    else
        say "need root to install: ${missing[*]}" >&2
        exit 1
    fi
    command -v apt-get >/dev/null 2>&1 || { say "not a Debian system; install by hand: ${missing[*]}" >&2; exit 1; }
    # An empty or stale package list does not know the names: refresh it only then.
    if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
        "${as_root[@]}" apt-get update -qq >/dev/null
    fi
    say "apt-get install ${missing[*]}"
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Python: the project and its test extra ---------------------------------------------------------
say "pip install -e .[test]"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-input -e "${REPO_ROOT}[test]"

# --- Spark pipeline (integration/spark): pyspark pinned to the Kafka connector's minor version --------
say "pip install -r integration/spark/requirements.txt"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-input -r "${REPO_ROOT}/integration/spark/requirements.txt"

# --- KafkaJS (version pinned in tests/js/package.json) ------------------------------------------------
js_dir="${REPO_ROOT}/tests/js"
wanted="$(node -p "require('${js_dir}/package.json').dependencies.kafkajs")"
installed="$(node -p "try { require('${js_dir}/node_modules/kafkajs/package.json').version } catch (e) { '' }")"
if [ "$installed" != "$wanted" ]; then
    say "npm install kafkajs@${wanted}"
    npm install --prefix "$js_dir" --no-audit --no-fund --no-package-lock --loglevel=error >/dev/null
fi

say "done"
