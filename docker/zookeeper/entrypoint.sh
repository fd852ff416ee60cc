#!/bin/bash
# The ZooKeeper container's entry point: `zookeeper-entrypoint` (no argument) writes zoo.cfg from the
# environment and execs the standalone server (PID 1: docker stop's SIGTERM reaches the JVM);
# `zookeeper-entrypoint ruok` is the health check (the server answers the four-letter word with imok).
set -euo pipefail
host="${ZOO_HOST:-127.0.0.1}"
port="${ZOO_PORT:-2181}"

if [ "${1:-}" = ruok ]; then
    probe="$host"; [ "$probe" = 0.0.0.0 ] && probe=127.0.0.1
    exec 3<>"/dev/tcp/$probe/$port"
    printf ruok >&3
    answer="$(timeout 3 cat <&3 || true)"
    [ "$answer" = imok ] || { echo "ZooKeeper on $probe:$port answered '${answer}'" >&2; exit 1; }
    exit 0
fi
[ $# -eq 0 ] || exec "$@"

mkdir -p /data/data
cat > /data/zoo.cfg <<CFG
tickTime=2000
dataDir=/data/data
clientPort=$port
clientPortAddress=$host
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr,cons,conf
CFG
exec java "-Xmx${ZOO_HEAP:-256m}" -XX:+UseSerialGC \
    -Dzookeeper.admin.enableServer=false \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    -Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.NIOServerCnxn=warn \
    -Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.command.FourLetterCommands=warn \
    -cp /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar \
    org.apache.zookeeper.server.ZooKeeperServerMain /data/zoo.cfg
