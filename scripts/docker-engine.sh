#!/usr/bin/env bash
# The Docker engine the container tests use, and the local base image they build on.
#
#   scripts/docker-engine.sh start        use the engine `docker info` reaches; else start dockerd (as root)
#                                         with --bridge=none --iptables=false --ip6tables=false, wait for it
#                                         (deadline), and record that this script started it.
#                                         Prints "running" (an engine was there) or "started" (we started it).
#   scripts/docker-engine.sh stop         stop the dockerd this script started (and only that one); nothing
#                                         to do when it started none. Prints "stopped" or "not started here".
#   scripts/docker-engine.sh base-image   build pykbroker-debian:bookworm (debootstrap --variant=minbase from
#                                         the Debian mirror apt already uses, then `docker import`) if missing.
#                                         Prints the tag.
#   scripts/docker-engine.sh status       "running" or "not running" (exit status 0 or 1).
#
# Exit status: 0 done; 1 the engine is unreachable or could not start / the base image could not be built
# (a line on stderr says why); 2 usage error. Only host networking works with the engine it starts
# (--bridge=none): run containers with --network host.
#
# Environment: DOCKER_ENGINE_STATE_DIR (default /run/pykbroker-dockerd: pidfile, log, the "started" record),
# DOCKER_ENGINE_START_TIMEOUT (s, default 60), PYKBROKER_BASE_IMAGE (default pykbroker-debian:bookworm),
# DEBIAN_MIRROR (default: the first Debian URI in apt's sources, else http://deb.debian.org/debian),
# DOCKERD_EXTRA_ARGS (more dockerd options, e.g. -H/--data-root/--exec-root for a second engine beside the
# default one; then set DOCKER_HOST to its socket).
set -euo pipefail

STATE_DIR="${DOCKER_ENGINE_STATE_DIR:-/run/pykbroker-dockerd}"
PIDFILE="$STATE_DIR/dockerd.pid"
LOGFILE="$STATE_DIR/dockerd.log"
STARTED="$STATE_DIR/started-by-script"     # holds the pid of the dockerd this script started
START_TIMEOUT="${DOCKER_ENGINE_START_TIMEOUT:-60}"
BASE_IMAGE="${PYKBROKER_BASE_IMAGE:-pykbroker-debian:bookworm}"
SUITE=bookworm

say() { printf 'docker-engine: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

docker_cli() {
    # Debian's client (/usr/bin/docker) matches Debian's dockerd; any docker on PATH otherwise.
    if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else command -v docker || true; fi
}

engine_up() {
    local cli; cli="$(docker_cli)"
    [ -n "$cli" ] && "$cli" info >/dev/null 2>&1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo -n "$@"
    else return 126
    fi
}

# One start/stop/base-image at a time (two test sessions may ask together).
lock() {
    mkdir -p "$STATE_DIR" 2>/dev/null || as_root mkdir -p "$STATE_DIR" || die "cannot create $STATE_DIR"
    exec 9>>"$STATE_DIR/lock" || die "cannot open $STATE_DIR/lock"
    flock -w 600 9 || die "timed out waiting for $STATE_DIR/lock"
}

cmd_start() {
    lock
    if engine_up; then echo running; return 0; fi
    command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] \
        || die "no Docker engine reachable and no dockerd installed (Debian: apt-get install docker.io)"
    local dockerd; dockerd="$(command -v dockerd || echo /usr/sbin/dockerd)"
    [ "$(id -u)" -eq 0 ] || { sudo -n true 2>/dev/null || die "no Docker engine reachable and starting dockerd needs root"; }
    # A dockerd of ours that died leaves its pidfile: dockerd refuses to start over a live one only.
    rm -f "$STARTED"
    say "starting $dockerd (log: $LOGFILE)"
    # fd 9 (the lock) closed for dockerd, so the lock ends with this script.
    # shellcheck disable=SC2086  # DOCKERD_EXTRA_ARGS is a word list
    as_root setsid "$dockerd" --bridge=none --iptables=false --ip6tables=false \
        --pidfile "$PIDFILE" ${DOCKERD_EXTRA_ARGS:-} >"$LOGFILE" 2>&1 < /dev/null 9>&- &
    local launcher=$!
    local deadline=$((SECONDS + START_TIMEOUT))
    until engine_up; do
        if ! kill -0 "$launcher" 2>/dev/null; then
            wait "$launcher" 2>/dev/null || true
            die "dockerd exited during start-up; end of $LOGFILE:
$(tail -n 15 "$LOGFILE" 2>/dev/null)"
        fi
        if ((SECONDS >= deadline)); then
            kill "$launcher" 2>/dev/null || true
            die "dockerd did not answer within ${START_TIMEOUT}s; end of $LOGFILE:
$(tail -n 15 "$LOGFILE" 2>/dev/null)"
        fi
        sleep 0.5
    done
    local pid; pid="$(cat "$PIDFILE" 2>/dev/null || echo "$launcher")"
    echo "$pid" > "$STARTED"
    echo started
}

cmd_stop() {
    lock
    if [ ! -s "$STARTED" ]; then echo "not started here"; return 0; fi
    local pid; pid="$(cat "$STARTED")"
    # Only the process we recorded, and only while it still is a dockerd.
    if [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = dockerd ]; then
        as_root kill -TERM "$pid" || die "cannot signal dockerd $pid"
        local deadline=$((SECONDS + 60))
        while [ -e "/proc/$pid" ]; do
            ((SECONDS < deadline)) || { as_root kill -KILL "$pid" 2>/dev/null || true; break; }
            sleep 0.5
        done
    fi
    rm -f "$STARTED"
    echo stopped
}

debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
    local uri=""
    # deb822 sources first (bookworm's default), then one-line sources; the first main Debian archive wins.
    uri="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }' | grep -v -e security -e '^cdrom' | head -n 1 || true)"
    if [ -z "$uri" ]; then
        uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
            | awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) { print $i; break } }' \
            | grep -v security | head -n 1 || true)"
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

cmd_base_image() {
    engine_up || die "no Docker engine reachable (run: $0 start)"
    local cli; cli="$(docker_cli)"
    lock
    if "$cli" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then echo "$BASE_IMAGE"; return 0; fi
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] \
        || die "debootstrap is not installed (Debian: apt-get install debootstrap)"
    [ "$(id -u)" -eq 0 ] || die "debootstrap needs root to build $BASE_IMAGE"
    local mirror; mirror="$(debian_mirror)"
    local root; root="$(mktemp -d /var/tmp/pykbroker-debootstrap.XXXXXX)"
    trap 'rm -rf "$root"' EXIT
    say "debootstrap --variant=minbase $SUITE from $mirror (a few minutes, once)"
    if ! PATH="$PATH:/usr/sbin:/sbin" debootstrap --variant=minbase "$SUITE" "$root" "$mirror" \
            >"$STATE_DIR/debootstrap.log" 2>&1; then
        die "debootstrap failed; end of $STATE_DIR/debootstrap.log:
$(tail -n 15 "$STATE_DIR/debootstrap.log")"
    fi
    # apt inside the image: no caches left from debootstrap.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | "$cli" import - "$BASE_IMAGE" >/dev/null || die "docker import of $BASE_IMAGE failed"
    rm -rf "$root"; trap - EXIT
    echo "$BASE_IMAGE"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    base-image) cmd_base_image ;;
    status) if engine_up; then echo running; else echo "not running"; exit 1; fi ;;
    *) echo "usage: $0 start|stop|base-image|status" >&2; exit 2 ;;
esac
