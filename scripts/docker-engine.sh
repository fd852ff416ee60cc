#!/usr/bin/env bash
# The Docker engine the container tests use, and the local base image they build on.
#
#   scripts/docker-engine.sh start        use the engine `docker info` reaches; else start dockerd (as root)
#                                         with --bridge=none --iptables=false --ip6tables=false, wait for it
#                                         (deadline; past it, that dockerd is killed), and record that this
#                                         script started it. Takes a lease for the calling session (the pid
#                                         DOCKER_ENGINE_LEASE_PID, default the caller's: $PPID).
#                                         Prints "running" (an engine was there) or "started" (we started it).
#   scripts/docker-engine.sh stop         give the session's lease back; stop the dockerd this script started
#                                         (and only that one) once no live lease remains (leases of dead pids
#                                         are dropped). Prints "stopped", "still in use" (another session
#                                         holds a lease) or "not started here".
#   scripts/docker-engine.sh base-image   build pykbroker-debian:bookworm (debootstrap --variant=minbase from
#                                         the Debian mirror apt already uses, then `docker import`) if missing.
#                                         Prints the tag.
#   scripts/docker-engine.sh status       "running" or "not running" (exit status 0 or 1).
#   scripts/docker-engine.sh clean        remove every image the suite built (label org.pykbroker.test: the
#                                         per-checkout pykbroker, zookeeper and kafka-reference images and
#                                         the base image); images of running containers stay. The next
#                                         test run builds them again (the base image: a few minutes).
#
# Exit status: 0 done; 1 the engine is unreachable or could not start / the base image could not be built
# (a line on stderr says why); 2 usage error. Only host networking works with the engine it starts
# (--bridge=none): run containers with --network host.
#
# Environment: DOCKER_ENGINE_STATE_DIR (default /run/pykbroker-dockerd: pidfile, log, the "started" record,
# users/<pid> leases), DOCKER_ENGINE_LEASE_PID (the session the lease is for),
# DOCKER_ENGINE_START_TIMEOUT (s, default 60), DEBIAN_BASE_IMAGE (default pykbroker-debian:bookworm),
# DEBIAN_MIRROR (default: the first Debian URI in apt's sources, else http://deb.debian.org/debian),
# DOCKERD_EXTRA_ARGS (more dockerd options, e.g. -H/--data-root/--exec-root for a second engine beside the
# default one; then set DOCKER_HOST to its socket).
set -euo pipefail

STATE_DIR="${DOCKER_ENGINE_STATE_DIR:-/run/pykbroker-dockerd}"
PIDFILE="$STATE_DIR/dockerd.pid"
LOGFILE="$STATE_DIR/dockerd.log"
STARTED="$STATE_DIR/started-by-script"     # holds the pid of the dockerd this script started
USERS_DIR="$STATE_DIR/users"               # the leases: one file per session (its pid) using the engine
START_TIMEOUT="${DOCKER_ENGINE_START_TIMEOUT:-60}"
BASE_IMAGE="${DEBIAN_BASE_IMAGE:-pykbroker-debian:bookworm}"
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

# Leases: every session that asked for the engine (start) holds $USERS_DIR/<pid> until it gives it back
# (stop); the dockerd this script started stops only when no live lease remains. A lease whose pid is gone
# (a SIGKILLed session) is stale and removed on the next start or stop.
lease_pid() { echo "${DOCKER_ENGINE_LEASE_PID:-$PPID}"; }

prune_leases() {
    local lease
    mkdir -p "$USERS_DIR"
    for lease in "$USERS_DIR"/*; do
        [ -e "$lease" ] || continue
        kill -0 "${lease##*/}" 2>/dev/null || rm -f "$lease"
    done
}

live_leases() { find "$USERS_DIR" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }

is_dockerd() { [ -r "/proc/$1/comm" ] && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = dockerd ]; }

# SIGTERM to the dockerd pid, wait (up to $2 s) until it is gone, then SIGKILL.
stop_dockerd() {
    local pid="$1" deadline=$((SECONDS + $2))
    is_dockerd "$pid" || return 0
    as_root kill -TERM "$pid" 2>/dev/null || die "cannot signal dockerd $pid"
    # (a zombie child of this script, the dockerd of a failed start, counts as gone: its caller reaps it)
    while is_dockerd "$pid" && ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null; do
        ((SECONDS < deadline)) || { as_root kill -KILL "$pid" 2>/dev/null || true; }
        ((SECONDS < deadline + 10)) || die "dockerd $pid did not exit after SIGKILL"
        sleep 0.2
    done
}

cmd_start() {
    lock
    prune_leases
    if engine_up; then
        # A dockerd another session started: hold a lease so that its stop leaves the engine to us.
        touch "$USERS_DIR/$(lease_pid)"
        echo running; return 0
    fi
    command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] \
        || die "no Docker engine reachable and no dockerd installed (Debian: apt-get install docker.io)"
    local dockerd; dockerd="$(command -v dockerd || echo /usr/sbin/dockerd)"
    [ "$(id -u)" -eq 0 ] || { sudo -n true 2>/dev/null || die "no Docker engine reachable and starting dockerd needs root"; }
    # The record of a dockerd of ours that died, and its pidfile (dockerd refuses to start over a live one only).
    rm -f "$STARTED"
    if [ -s "$PIDFILE" ] && ! is_dockerd "$(cat "$PIDFILE")"; then as_root rm -f "$PIDFILE" || true; fi
    say "starting $dockerd (log: $LOGFILE)"
    # fd 9 (the lock) closed for dockerd, so the lock ends with this script. A subshell launches dockerd and
    # waits for it (its parent: it reaps dockerd when dockerd stops, whatever init the machine has). As root
    # the subshell's $! is dockerd itself (setsid does not fork: a background job is no process group
    # leader), written to $launched; through sudo it is sudo, and dockerd's pid comes from its pidfile.
    local launched="$STATE_DIR/launched.pid" launcher pid=""
    rm -f "$launched"
    (
        # shellcheck disable=SC2086  # DOCKERD_EXTRA_ARGS is a word list
        if [ "$(id -u)" -eq 0 ]; then
            setsid "$dockerd" --bridge=none --iptables=false --ip6tables=false \
                --pidfile "$PIDFILE" ${DOCKERD_EXTRA_ARGS:-} >"$LOGFILE" 2>&1 < /dev/null &
            echo $! > "$launched"
        else
            sudo -n setsid "$dockerd" --bridge=none --iptables=false --ip6tables=false \
                --pidfile "$PIDFILE" ${DOCKERD_EXTRA_ARGS:-} >"$LOGFILE" 2>&1 < /dev/null &
        fi
        wait
    ) 9>&- > /dev/null 2>&1 < /dev/null &
    launcher=$!
    if [ "$(id -u)" -eq 0 ]; then
        until [ -s "$launched" ]; do
            kill -0 "$launcher" 2>/dev/null || die "could not launch $dockerd"
            sleep 0.05
        done
        pid="$(cat "$launched")"
    fi
    [ -z "$pid" ] || echo "$pid" > "$STARTED"
    local deadline=$((SECONDS + START_TIMEOUT))
    until engine_up; do
        if [ -z "$pid" ] && [ -s "$PIDFILE" ] && is_dockerd "$(cat "$PIDFILE")"; then
            pid="$(cat "$PIDFILE")"; echo "$pid" > "$STARTED"
        fi
        if ! kill -0 "$launcher" 2>/dev/null; then
            wait "$launcher" 2>/dev/null || true
            rm -f "$STARTED"
            die "dockerd exited during start-up; end of $LOGFILE:
$(tail -n 15 "$LOGFILE" 2>/dev/null)"
        fi
        if ((SECONDS >= deadline)); then
            [ -z "$pid" ] || stop_dockerd "$pid" 10
            kill "$launcher" 2>/dev/null || true
            wait "$launcher" 2>/dev/null || true
            rm -f "$STARTED"
            die "dockerd did not answer within ${START_TIMEOUT}s (stopped it); end of $LOGFILE:
$(tail -n 15 "$LOGFILE" 2>/dev/null)"
        fi
        sleep 0.5
    done
    if [ -z "$pid" ]; then pid="$(cat "$PIDFILE")"; echo "$pid" > "$STARTED"; fi
    touch "$USERS_DIR/$(lease_pid)"
    echo started
}

cmd_stop() {
    lock
    rm -f "$USERS_DIR/$(lease_pid)"
    prune_leases
    if [ ! -s "$STARTED" ]; then echo "not started here"; return 0; fi
    if (($(live_leases) > 0)); then echo "still in use"; return 0; fi
    # Only the process we recorded, and only while it still is a dockerd.
    stop_dockerd "$(cat "$STARTED")" 60
    rm -f "$STARTED"
    echo stopped
}

debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
    local uri=""
    # The main Debian archive apt uses for bookworm: a URI ending in /debian of an entry whose suites name
    # bookworm itself (not another distribution's sources, not the security archive). deb822 sources first
    # (bookworm's default), then one-line sources.
    uri="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v suite="$SUITE" '
        function flush() { if (uris != "" && (" " suites " ") ~ (" " suite " ")) print uris; uris = ""; suites = "" }
        /^[[:space:]]*$/ { flush(); next }
        /^URIs:/ { uris = ""; for (i = 2; i <= NF; i++) uris = uris (uris == "" ? "" : " ") $i }
        /^Suites:/ { suites = ""; for (i = 2; i <= NF; i++) suites = suites " " $i }
        END { flush() }' | tr ' ' '\n' | grep -E '^(https?|file):.*/debian/?$' | head -n 1 || true)"
    if [ -z "$uri" ]; then
        uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
            | sed -e 's/\[[^]]*\]//' \
            | awk -v suite="$SUITE" '$1 == "deb" && $3 == suite && $2 ~ /^(https?|file):.*\/debian\/?$/ { print $2 }' \
            | head -n 1 || true)"
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
    tar -C "$root" -c . | "$cli" import --change "LABEL org.pykbroker.test=base" - "$BASE_IMAGE" >/dev/null \
        || die "docker import of $BASE_IMAGE failed"
    rm -rf "$root"; trap - EXIT
    echo "$BASE_IMAGE"
}

cmd_clean() {
    engine_up || die "no Docker engine reachable (run: $0 start)"
    local cli; cli="$(docker_cli)"
    local ids; ids="$( { "$cli" image ls -q --filter label=org.pykbroker.test; \
        "$cli" image ls -q "$BASE_IMAGE"; } | sort -u)"
    local removed=0 id
    for id in $ids; do
        if "$cli" image rm -f "$id" >/dev/null 2>&1; then removed=$((removed + 1)); else say "kept $id (in use)"; fi
    done
    echo "removed $removed images"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    base-image) cmd_base_image ;;
    clean) cmd_clean ;;
    status) if engine_up; then echo running; else echo "not running"; exit 1; fi ;;
    *) echo "usage: $0 start|stop|base-image|status|clean" >&2; exit 2 ;;
esac
