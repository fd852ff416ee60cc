"""Java's TLS stack, configured by Kafka 3.7.1's own client-side code, against a server context built by
pykbroker/security/tls.py: what the Java client and Spark will meet once listeners are wired.

A small Java program (written to a temp dir at run time, run with the reference kit's Kafka 3.7.1 jars) builds
Kafka's DefaultSslEngineFactory from ssl.* properties, takes the SSLParameters of the client engine Kafka would
create (protocols, cipher suites, endpoint identification) onto a socket, connects, and prints the protocol,
the cipher suite Java negotiated and the first line the server sent (the principal it computed). The server is
the unit tests' asyncio server (tests/unit/test_security_tls.py), accepting as the broker will.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path

import pytest

pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
from cryptography.hazmat.primitives import serialization  # noqa: E402

from kafka_tools import find_refkit, unavailable_reason  # noqa: E402
from kafka_tools import KAFKA_DIST  # noqa: E402
from pykbroker.security.tls import TlsContextHolder  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "_tls_unit_helpers", Path(__file__).resolve().parents[1] / "unit" / "test_security_tls.py")
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)
pki = helpers.pki  # the module-scoped certificate fixture

JAVA_CLIENT = r"""
import java.io.*;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.*;
import javax.net.ssl.*;
import org.apache.kafka.common.config.SslConfigs;
import org.apache.kafka.common.config.types.Password;
import org.apache.kafka.common.security.ssl.DefaultSslEngineFactory;

public class TlsProbe {
    public static void main(String[] args) throws Exception {
        String host = args[0];
        int port = Integer.parseInt(args[1]);
        Properties props = new Properties();
        try (InputStream in = new FileInputStream(args[2])) { props.load(in); }
        Map<String, Object> configs = new HashMap<>();
        configs.put(SslConfigs.SSL_PROTOCOL_CONFIG, "TLSv1.3");
        configs.put(SslConfigs.SSL_ENABLED_PROTOCOLS_CONFIG, Arrays.asList("TLSv1.2", "TLSv1.3"));
        configs.put(SslConfigs.SSL_KEYSTORE_TYPE_CONFIG, "JKS");
        configs.put(SslConfigs.SSL_TRUSTSTORE_TYPE_CONFIG, "JKS");
        for (String name : props.stringPropertyNames()) {
            String value = props.getProperty(name);
            if (name.endsWith(".password") || name.equals("ssl.truststore.certificates")) configs.put(name, new Password(value));
            else if (name.equals(SslConfigs.SSL_CIPHER_SUITES_CONFIG) || name.equals(SslConfigs.SSL_ENABLED_PROTOCOLS_CONFIG))
                configs.put(name, Arrays.asList(value.split(",")));
            else configs.put(name, value);
        }
        DefaultSslEngineFactory factory = new DefaultSslEngineFactory();
        factory.configure(configs);
        String identification = props.getProperty("ssl.endpoint.identification.algorithm", "https");
        SSLParameters params = factory.createClientSslEngine(host, port, identification).getSSLParameters();
        try (SSLSocket socket = (SSLSocket) factory.sslContext().getSocketFactory().createSocket(host, port)) {
            socket.setSSLParameters(params);
            socket.setSoTimeout(20000);
            socket.startHandshake();
            BufferedReader reader = new BufferedReader(new InputStreamReader(socket.getInputStream(), StandardCharsets.UTF_8));
            String line = reader.readLine();
            SSLSession session = socket.getSession();
            System.out.println("RESULT " + session.getProtocol() + " " + session.getCipherSuite() + " " + line);
        } catch (IOException e) {
            System.out.println("FAILED " + e);
        }
    }
}
"""


@pytest.fixture(scope="module")
def java_probe(tmp_path_factory):
    refkit = find_refkit()
    reason = unavailable_reason(refkit)
    if reason is not None:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("tls-probe")
    source = directory / "TlsProbe.java"
    source.write_text(JAVA_CLIENT)
    classpath = os.pathsep.join(str(jar) for jar in sorted((refkit / KAFKA_DIST / "libs").glob("*.jar")))

    async def probe(port: int, host: str, properties: dict[str, str]) -> str:
        props = directory / f"probe-{port}-{len(properties)}.properties"
        props.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
        process = await asyncio.create_subprocess_exec(
            "java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classpath, str(source),
            host, str(port), str(props), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(process.communicate(), 150)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise
        lines = [line for line in out.decode().splitlines() if line.startswith(("RESULT ", "FAILED "))]
        assert lines, f"TlsProbe printed nothing (exit {process.returncode}):\n{out.decode()}\n{err.decode()[-3000:]}"
        return lines[-1]
    return probe


def _run(holder, probe, *calls):
    async def go():
        async with helpers.Server(lambda: holder.context) as server:
            server.mapper = holder.mapper
            return [await probe(server.port, host, properties) for host, properties in calls]
    return asyncio.run(asyncio.wait_for(go(), 400))


def test_kafkas_java_client_side_meets_pykbroker_tls(pki, java_probe, tmp_path):
    holder = TlsContextHolder(helpers.pem_settings(pki, **{"ssl.client.auth": "requested"}))
    client_p12 = tmp_path / "client.p12"
    client_p12.write_bytes(helpers.p12(pki.client_key, pki.client, pki, "clientpass", name=b"client"))
    trust = {"ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file}
    by_name, by_ip, mutual = _run(
        holder, java_probe,
        ("localhost", trust),
        ("127.0.0.1", trust),
        ("localhost", {**trust, "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(client_p12),
                       "ssl.keystore.password": "clientpass"}),
    )
    assert by_name.startswith("RESULT TLSv1.3 TLS_") and by_name.endswith(" User:ANONYMOUS|TLSv1.3|" + by_name.split()[2])
    assert by_ip.startswith("RESULT TLSv1.3 ")  # Java's HTTPS check accepts the iPAddress SAN
    assert mutual.startswith("RESULT TLSv1.3 ") and " User:CN=client,OU=apps,O=pykbroker|" in mutual


def test_cipher_suite_restriction_as_java_names_it(pki, java_probe):
    holder = TlsContextHolder(helpers.pem_settings(pki, **{"ssl.cipher.suites": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}))
    trust = {"ssl.truststore.type": "PEM",
             "ssl.truststore.certificates": pki.ca.public_bytes(serialization.Encoding.PEM).decode().replace("\n", " ")}
    allowed, refused = _run(
        holder, java_probe,
        ("localhost", trust),
        ("localhost", {**trust, "ssl.cipher.suites": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,TLS_AES_128_GCM_SHA256"}),
    )
    assert allowed.startswith("RESULT TLSv1.2 TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 User:ANONYMOUS|TLSv1.2|"
                              "ECDHE-RSA-AES128-GCM-SHA256"), allowed
    assert refused.startswith("FAILED "), refused
