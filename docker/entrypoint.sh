#!/bin/sh
# The pykbroker image's entry point. No arguments: `pykbroker serve`; arguments starting with "-": options of
# `pykbroker serve`; anything else runs as given (`pykbroker --version`, `pykbroker topic list -b ...`, sh).
# `pykbroker serve` gets the image's defaults, each overridable by the variable itself: listen on every
# interface, data in the volume /data, /metrics, /health and /ready on 9644 (the HEALTHCHECK asks /health
# there). Other commands (e.g. `pykbroker cluster`, whose brokers each need their own ports and data dirs)
# get none of them.
# exec: the command becomes PID 1 and receives docker stop's SIGTERM itself (the broker shuts down cleanly).
case "${1:-}" in
    '' | -*) set -- pykbroker serve "$@" ;;
esac
if [ "$1" = pykbroker ] && [ "${2:-}" = serve ]; then
    export PYKBROKER_HOST="${PYKBROKER_HOST:-0.0.0.0}" PYKBROKER_DATA_DIR="${PYKBROKER_DATA_DIR:-/data}" \
        PYKBROKER_METRICS_PORT="${PYKBROKER_METRICS_PORT:-9644}"
fi
exec "$@"
