"""``pykbroker console``: a web console that reads a Kafka cluster through the Kafka protocol, like any
client, so it works against pykbroker and Apache Kafka alike.

* :mod:`pykbroker.console.data` - the data layer: confluent-kafka's AdminClient and Consumer (and
  DescribeLogDirs through pykbroker's own protocol client) behind plain dataclasses, every call bounded by
  a timeout.
* :mod:`pykbroker.console.html` - escaping and formatting (values as text, pretty JSON or hex).
* :mod:`pykbroker.console.pages` - the server-rendered pages.
* :mod:`pykbroker.console.server` - the HTTP server (stdlib ThreadingHTTPServer): routes, forms, the
  read-only default (writes only with ``--allow-writes``), error pages.
"""
