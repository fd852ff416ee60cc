"""``pykbroker cluster info``: brokers, controller and cluster id (DescribeCluster through the
AdminClient) and each broker's API versions (ApiVersions, which librdkafka does not expose: asked with
pykbroker's own protocol client, one connection per broker)."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from pykbroker.ctl.common import CLIENT_ID, EXIT_CODES_HELP, Connection, connection_options, node_json, section, table
from pykbroker.ctl.security import before_sasl


def api_name(key: int) -> str:
    """Kafka's name of an API key: pykbroker's support table, else kio's (any API another broker has)."""
    from kio.index import api_key_map

    from pykbroker.protocol.apis import SUPPORTED_APIS

    if key in SUPPORTED_APIS:
        return SUPPORTED_APIS[key].name
    name = api_key_map.get(key)
    return "".join(part.title() for part in name.split("_")) if name else f"api {key}"


async def _versions_of(host: str, port: int, timeout: float, security: Any) -> dict[int, tuple[int, int]]:
    from pykbroker.protocol.client import KafkaClientConnection

    connection = await KafkaClientConnection.connect(host, port, client_id=CLIENT_ID, connect_timeout=timeout,
                                                     request_timeout=timeout, security=security)
    try:
        return dict(connection.api_versions)
    finally:
        await connection.aclose()


async def api_versions(brokers: list[Any], timeout: float, security: Any = None) -> dict[int, Any]:
    """Broker id -> {api key: (min, max)}, or the error text for a broker that did not answer; ``security``
    the connection's TLS and SASL (Connection.security)."""
    results = await asyncio.gather(*(_versions_of(b.host, b.port, timeout, security) for b in brokers),
                                   return_exceptions=True)
    return {broker.id: (str(result) if isinstance(result, BaseException) else result)
            for broker, result in zip(brokers, results)}


def cluster_info(conn: Connection, with_versions: bool) -> dict[str, Any]:
    described = conn.cluster()
    brokers = sorted(described.nodes, key=lambda node: node.id)
    controller = described.controller.id if described.controller is not None else None
    info: dict[str, Any] = {
        "cluster_id": described.cluster_id, "controller": controller,
        "brokers": [{**node_json(node), "controller": node.id == controller} for node in brokers],
    }
    if with_versions:
        versions = asyncio.run(api_versions(brokers, conn.timeout, before_sasl(conn.security)))
        for entry in info["brokers"]:
            found = versions[entry["id"]]
            if isinstance(found, str):
                entry["api_versions_error"] = found
            else:
                entry["api_versions"] = [{"api_key": key, "name": api_name(key), "min": low, "max": high}
                                         for key, (low, high) in sorted(found.items())]
    return info


def _render(info: dict[str, Any]) -> None:
    section("Cluster")
    table(["name", "value"], [["cluster id", info["cluster_id"]], ["controller", info["controller"]],
                              ["brokers", len(info["brokers"])]])
    click.echo()
    section("Brokers")
    table(["id", "host", "port", "rack", "controller"],
          [[b["id"], b["host"], b["port"], b["rack"], "*" if b["controller"] else ""] for b in info["brokers"]])
    for broker in info["brokers"]:
        if "api_versions" in broker or "api_versions_error" in broker:
            click.echo()
            section(f"API versions of broker {broker['id']} ({broker['host']}:{broker['port']})")
            if "api_versions_error" in broker:
                click.echo(f"unavailable: {broker['api_versions_error']}")
            else:
                table(["key", "api", "min", "max"], [[v["api_key"], v["name"], v["min"], v["max"]]
                                                     for v in broker["api_versions"]])


@click.command("info", epilog=EXIT_CODES_HELP)
@click.option("--api-versions/--no-api-versions", "with_versions", default=True, show_default=True,
              help="Ask every broker for the API versions it supports.")
@connection_options
def info(conn: Connection, with_versions: bool) -> None:
    """The cluster id, the controller, the brokers and the API versions each one supports."""
    data = cluster_info(conn, with_versions)
    conn.emit(data, _render)
