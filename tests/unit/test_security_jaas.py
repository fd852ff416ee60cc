"""JAAS strings are read as Kafka 3.7's JaasConfig (java.io.StreamTokenizer) and
JaasContext.loadServerContext read them: values, quoting, comments, flags, several modules, and Kafka's
messages for malformed input."""

from __future__ import annotations

import pytest

from pykbroker.security import jaas
from pykbroker.security.jaas import JaasConfigError, parse_jaas_config

PLAIN = jaas.PLAIN_LOGIN_MODULE


def one(text: str) -> jaas.LoginModuleEntry:
    entries = parse_jaas_config(text)
    assert len(entries) == 1
    return entries[0]


def test_the_documented_plain_config():
    e = one(f'{PLAIN} required user_alice="alice-secret" username="admin" password="x";')
    assert e.login_module == PLAIN
    assert e.control_flag == "required"
    assert dict(e.options) == {"user_alice": "alice-secret", "username": "admin", "password": "x"}


@pytest.mark.parametrize("flag", ["required", "REQUISITE", "Sufficient", "optional"])
def test_control_flags_any_case(flag):
    assert one(f"a.B {flag};").control_flag == flag.lower()


def test_values_words_and_quotes():
    e = one("m required a=word-with_dash$and.dots b='single quoted' c=\"x=y;z\" d=\"\" e=\u00e9t\u00e9 f=\u65e5\u672c;")
    assert dict(e.options) == {"a": "word-with_dash$and.dots", "b": "single quoted", "c": "x=y;z", "d": "",
                               "e": "\u00e9t\u00e9", "f": "\u65e5\u672c"}


def test_escapes_in_quoted_strings():
    e = one(r'm required a="q\"uote" b="back\\slash" c="\n\t\r" d="\101\60\0" e="\x" f="\477";')
    assert e.options["a"] == 'q"uote'
    assert e.options["b"] == "back\\slash"
    assert e.options["c"] == "\n\t\r"
    assert e.options["d"] == "A0\x00"
    assert e.options["e"] == "x"           # any other escaped character is itself
    assert e.options["f"] == "\x277"       # \47 then '7': only \0-\377 take three digits


def test_comments_and_whitespace():
    e = one("// leading comment\nm /* inline */ required\n a=b // trailing\n c=\"d\"\t;")
    assert dict(e.options) == {"a": "b", "c": "d"}


def test_unquoted_slash_starts_a_comment_so_urls_must_be_quoted():
    # StreamTokenizer: a=http, then ':' (a symbol, no string value) as the next key, then '//' comments out
    # the rest of the line
    with pytest.raises(JaasConfigError, match="Value not specified for key 'null' in JAAS config"):
        parse_jaas_config("m required a=http://host b=c;")
    assert one('m required a="http://host/x";').options["a"] == "http://host/x"


def test_several_modules_in_order():
    entries = parse_jaas_config("a.One required x=\"1\"; b.Two optional; c.Three sufficient y=z;")
    assert [(e.login_module, e.control_flag) for e in entries] == [
        ("a.One", "required"), ("b.Two", "optional"), ("c.Three", "sufficient")]
    assert entries[2].options == {"y": "z"}


def test_a_number_as_key_is_dropped():
    # Kafka stores it under a null key, which no lookup can ever find
    assert one("m required 5=x b=c;").options == {"b": "c"}


def test_later_duplicate_key_wins():
    assert one('m required a="1" a="2";').options == {"a": "2"}


def test_repr_hides_option_values():
    e = one('m required password="hunter2";')
    assert "hunter2" not in repr(e) and "password" in repr(e)


@pytest.mark.parametrize("text, message", [
    ("", "Login module not specified in JAAS config"),
    ("   // only a comment", "Login module not specified in JAAS config"),
    ("m", "Login module control flag not specified in JAAS config"),
    ("m 123;", "Login module control flag is not available in the JAAS config"),
    ("m mandatory;", "Invalid login module control flag 'mandatory' in JAAS config"),
    ("m required a=b", "JAAS config entry not terminated by semi-colon"),
    ("m required a;", "Value not specified for key 'a' in JAAS config"),
    ("m required a=;", "Value not specified for key 'a' in JAAS config"),
    ("m required a=", "Value not specified for key 'a' in JAAS config"),
    ("m required a b=c;", "Value not specified for key 'a' in JAAS config"),
    # an unquoted number is a NUMBER token without a string value: Kafka refuses it
    ("m required iterations=4096;", "Value not specified for key 'iterations' in JAAS config"),
    ("m required 5;", "Value not specified for key 'null' in JAAS config"),
    ('"" required;', "Login module name not specified in JAAS config"),
])
def test_malformed_strings_have_kafkas_messages(text, message):
    with pytest.raises(JaasConfigError) as e:
        parse_jaas_config(text)
    assert str(e.value) == message


def test_garbage_never_crashes():
    for text in ["\x00\x01\x02", "/*", "'", "\\", "m required a=\"\\", "- - -", "=;=;", ";;;", "m required a='x\n;",
                 "\ud800 required;", "m required a=-5;", "m required a=-b;"]:
        try:
            parse_jaas_config(text)
        except JaasConfigError:
            pass


def test_open_quote_ends_at_the_line_end_as_in_java():
    # StreamTokenizer closes an unterminated quoted string at the line break
    assert one("m required a=\"abc\n;").options == {"a": "abc"}


LISTENER_KEY = "listener.name.sasl_ssl.plain.sasl.jaas.config"


def test_server_entry_is_listener_and_mechanism_prefixed():
    configs = {LISTENER_KEY: f'{PLAIN} required user_a="b";'}
    entry = jaas.server_jaas_entry("SASL_SSL", "PLAIN", configs)
    assert entry.options == {"user_a": "b"}


def test_unprefixed_or_listener_only_config_is_ignored_like_kafka(caplog):
    configs = {"sasl.jaas.config": f"{PLAIN} required;",
               "plain.sasl.jaas.config": f"{PLAIN} required;"}
    with pytest.raises(JaasConfigError) as e:
        jaas.server_jaas_entry("SASL_SSL", "PLAIN", configs)
    assert str(e.value).startswith("Could not find a 'KafkaServer' or 'sasl_ssl.KafkaServer' entry in the JAAS "
                                   "configuration. System property 'java.security.auth.login.config' is not set")
    assert LISTENER_KEY in str(e.value)
    assert "should be prefixed with SASL mechanism name" in caplog.text


def test_server_entry_must_be_exactly_one_module():
    configs = {LISTENER_KEY: f"{PLAIN} required; {PLAIN} optional;"}
    with pytest.raises(JaasConfigError, match="JAAS config property contains 2 login modules, should be 1 module"):
        jaas.server_jaas_entry("SASL_SSL", "PLAIN", configs)


def test_disallowed_login_module():
    configs = {LISTENER_KEY: "com.sun.security.auth.module.JndiLoginModule required;"}
    with pytest.raises(JaasConfigError, match="is not allowed"):
        jaas.server_jaas_entry("SASL_SSL", "PLAIN", configs)


def test_config_entry_option_only_from_the_named_module():
    entries = parse_jaas_config(f'x.Other required user_a="1"; {PLAIN} required user_a="2";')
    assert jaas.config_entry_option(entries, "user_a", PLAIN) == "2"
    assert jaas.config_entry_option(entries, "user_a") == "1"
    assert jaas.config_entry_option(entries, "user_b", PLAIN) is None


def test_listener_mechanism_config_lookup_order():
    key = "sasl.oauthbearer.expected.issuer"
    configs = {key: "global", "listener.name.l.sasl.oauthbearer.expected.issuer": "listener",
               "listener.name.l.oauthbearer.sasl.oauthbearer.expected.issuer": "mechanism"}
    assert jaas.listener_mechanism_config(configs, "L", "OAUTHBEARER", key) == "mechanism"
    del configs["listener.name.l.oauthbearer.sasl.oauthbearer.expected.issuer"]
    assert jaas.listener_mechanism_config(configs, "L", "OAUTHBEARER", key) == "listener"
    del configs["listener.name.l.sasl.oauthbearer.expected.issuer"]
    assert jaas.listener_mechanism_config(configs, "L", "OAUTHBEARER", key) == "global"
    assert jaas.listener_mechanism_config({}, "L", "OAUTHBEARER", key, "d") == "d"


# --- differential: the same strings through Kafka 3.7.1's own JaasConfig (reference kit, javac) ---------------

JAVA_PROBE = r"""
package org.apache.kafka.common.security;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Map;
import java.util.TreeMap;
import javax.security.auth.login.AppConfigurationEntry;

// Reads base64 JAAS strings, one a line; prints how Kafka's JaasConfig reads each.
public class PykJaasProbe {
    static String b64(String s) { return Base64.getEncoder().encodeToString(s.getBytes(StandardCharsets.UTF_8)); }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String text = new String(Base64.getDecoder().decode(line), StandardCharsets.UTF_8);
            StringBuilder out = new StringBuilder();
            try {
                AppConfigurationEntry[] entries = new JaasConfig("X", text).getAppConfigurationEntry("X");
                out.append("OK");
                for (AppConfigurationEntry e : entries) {
                    out.append('\t').append(b64(e.getLoginModuleName())).append(',')
                       .append(e.getControlFlag().toString().replace("LoginModuleControlFlag: ", ""));
                    Map<String, String> sorted = new TreeMap<>();
                    for (Map.Entry<String, ?> o : e.getOptions().entrySet())
                        if (o.getKey() != null) sorted.put(o.getKey(), (String) o.getValue());
                    for (Map.Entry<String, String> o : sorted.entrySet())
                        out.append(',').append(b64(o.getKey())).append('=').append(b64(o.getValue()));
                }
            } catch (Exception e) {
                out.append("ERR\t").append(b64(String.valueOf(e.getMessage())));
            }
            System.out.println(out);
        }
    }
}
"""


def kafka_java_probe(work, source: str, class_name: str, jars: list[str]) -> list[str]:
    """Compile ``source`` (a probe class placed in one of Kafka's packages, to reach package-private parts)
    against jars of the reference kit's Kafka 3.7.1 and return the java command that runs it; skips without
    javac/java or the kit. Shared by the SASL tests' comparisons with Kafka's own classes."""
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    candidates = [base / "shared" / "refkit" / "kafka_2.13-3.7.1" / "libs" for base in (root.parent, root.parent.parent)]
    libs = next((c for c in candidates if (c / "kafka-clients-3.7.1.jar").is_file()), None)
    if libs is None or not (shutil.which("javac") and shutil.which("java")):
        pytest.skip("needs javac/java and kafka-clients-3.7.1.jar from ../shared/refkit (the reference kit)")
    cp = ":".join(str(libs / name) for name in ["kafka-clients-3.7.1.jar", "slf4j-api-1.7.36.jar", *jars])
    src = Path(work) / f"{class_name.rsplit('.', 1)[-1]}.java"
    src.write_text(source)
    subprocess.run(["javac", "-cp", cp, "-d", str(Path(work) / "classes"), str(src)], check=True, capture_output=True,
                   timeout=240)
    return ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{Path(work) / 'classes'}:{cp}",
            class_name]


def _ours(text: str) -> str:
    import base64

    b64 = lambda s: base64.b64encode(s.encode("utf-8", "surrogatepass")).decode()  # noqa: E731
    try:
        entries = parse_jaas_config(text)
    except JaasConfigError as e:
        if str(e) == "Login module name not specified in JAAS config":
            return "ERR\t" + b64("null")  # AppConfigurationEntry's IllegalArgumentException has no message
        return "ERR\t" + b64(str(e))
    return "OK" + "".join(
        "\t" + b64(e.login_module) + "," + e.control_flag
        + "".join(f",{b64(k)}={b64(v)}" for k, v in sorted(e.options.items())) for e in entries)


def _corpus() -> list[str]:
    import random

    fixed = [
        f'{PLAIN} required user_alice="alice-secret" username="admin" password="x";',
        "a.B required; c.D Optional x=y;", "m required a=\"\\101\\477\\08\\\\\\q\";", "m required a='x\n;",
        "m required a=b/c d=e;", "m required a=b /*c*/ d=e;", "m required a=-5;", "m required a=-b;",
        "m required a=.5b;", "m required a=b.5;", "m required a=\u00e9\u0080x;", "m required \u65e5=\u672c;",
        "m required a=\"x\";;", ";", "= required;", "m required a=\"\\", "m required 5=x b=c;",
        "m required a=$x_y-z;", "m required a=\"\t\";", "/* open", "m required a=1e5;", "m required a=0x1F;",
    ]
    rng = random.Random(19)
    alphabet = ["m", "required", "optional", " ", "=", ";", '"', "'", "\\", "/", "*", "\n", "-", ".", "5", "a",
                "_", "$", "\u00e9", "\u0085", "\t", "k=v", "x.Y"]
    fuzz = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(400)]
    value_chars = ["a", "Z", "0", "7", "-", "_", "$", ".", " ", "\\", "\\n", "\\1", "\\47", "\\400", "'",
                   "=", ";", "/", "\u00e9", "\u4e2d", "\u0085", "*", "\t"]

    def value() -> str:
        body = "".join(rng.choice(value_chars) for _ in range(rng.randint(0, 6)))
        quote = rng.choice(['"', "'", ""])
        return f"{quote}{body}{quote}"

    structured = [" ".join([rng.choice(["m", "a.b.C", "x$y"]), rng.choice(["required", "SUFFICIENT", "requisite"])]
                           + [f"{rng.choice(['k', 'user_a', 'p_2', 'x-y'])}={value()}" for _ in range(rng.randint(0, 3))])
                  + rng.choice([";", ";", " ;", ""]) for _ in range(400)]
    return fixed + fuzz + structured


def test_same_reading_as_kafkas_jaas_config(tmp_path):
    import base64
    import subprocess

    java = kafka_java_probe(tmp_path, JAVA_PROBE, "org.apache.kafka.common.security.PykJaasProbe", [])
    corpus = _corpus()
    done = subprocess.run(java, input="\n".join(base64.b64encode(t.encode()).decode() for t in corpus) + "\n",
                          capture_output=True, text=True, timeout=240, check=True)
    kafkas = done.stdout.splitlines()
    assert len(kafkas) == len(corpus), done.stderr[-2000:]
    differ = [(t, k, _ours(t)) for t, k in zip(corpus, kafkas) if k != _ours(t)]
    assert not differ, "\n".join(f"{t!r}\n  kafka: {k}\n  ours:  {o}" for t, k, o in differ[:10])
