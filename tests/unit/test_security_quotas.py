"""Client quotas (pykbroker.security.quotas): Kafka's Rate over SampledStat, throttle times, the 8-level entity
precedence and metric tags - hand-computed examples from Kafka's formulas, bad input, and random scenarios
replayed against Kafka 3.7.1's own ClientQuotaManager / ClientRequestQuotaManager / Rate (reference kit jars,
a tiny Java probe compiled at test time; skipped without javac or the kit). Time is injected: no sleeps."""

from __future__ import annotations

import math
import random
import subprocess

import pytest

from pykbroker.security.principal import KafkaPrincipal
from pykbroker.security.quotas import (
    DEFAULT, FETCH, PRODUCE, REQUEST, UNLIMITED, ClientQuotaManager, ClientQuotas, ControllerMutationQuotaManager,
    QuotaEntity, Rate, ThrottlingQuotaExceeded, bounded_throttle_time, java_long_to_int, java_round, throttle_time,
)

# -- Rate / SampledStat --


def test_young_rate_is_spread_over_samples_minus_one_windows():
    r = Rate(11, 1000)
    r.record(2000, 0)
    assert r.window_size(0) == 10_000            # 0 ms elapsed + 10 windows
    assert r.measure(0) == 200.0
    assert r.window_size(1500) == 10_500         # 1 full window elapsed: 1500 + 9 * 1000
    assert r.measure(1500) == pytest.approx(2000 / 10.5)


def test_old_samples_are_reset_when_measured():
    r = Rate(11, 1000)
    r.record(20_000, 0)
    r.record(100, 11_000)                         # the first sample is 11 windows old: it restarts empty at 11000
    assert r.measure(11_000) == 100 / 10.0
    assert r.window_size(11_000) == 10_000


def test_samples_rotate_round_robin():
    r = Rate(3, 1000)
    for t in (0, 1000, 2000):
        r.record(10, t)
    r.record(10, 3000)                            # reuses slot 0, which restarts at 3000
    # oldest start is now 1000: 2000 ms elapsed = 2 full windows = samples - 1, nothing added
    assert r.window_size(3000) == 2000
    assert r.measure(3000) == 30 / 2.0


def test_window_size_at_least_one_ms():
    r = Rate(1, 1000)
    r.record(5, 7)
    assert r.window_size(7) == 1
    assert r.measure(7) == 5000.0


def test_rate_rejects_bad_settings():
    for bad in (0, -1, 1.5, None):
        with pytest.raises(ValueError):
            Rate(bad, 1000)
        with pytest.raises(ValueError):
            Rate(11, bad)


# -- QuotaUtils arithmetic --


def test_throttle_time_formula():
    # X = (O - T) / T * W
    assert throttle_time(2000.0, 1000.0, 10_000) == 10_000
    assert throttle_time(1100.0, 1000.0, 10_000) == 1000
    assert throttle_time(1536.0, 1024.0, 1) == 1              # exactly 0.5 rounds up (Math.round)
    assert throttle_time(1535.9, 1024.0, 1) == 0
    assert throttle_time(512.0, 1024.0, 1) == 0               # -0.5 rounds up to 0
    assert bounded_throttle_time(2000.0, 1000.0, 10_000, 1000) == 1000
    assert bounded_throttle_time(1010.0, 1000.0, 10_000, 1000) == 100


def test_java_rounding_and_narrowing():
    assert java_round(-2.5) == -2 and java_round(2.5) == 3 and java_round(math.nan) == 0
    assert java_round(math.inf) == 2**63 - 1 and java_round(-math.inf) == -(2**63)
    assert java_long_to_int(2**63 - 1) == -1
    assert java_long_to_int(10_000_000_000) == 1_410_065_408
    # a byte rate of 0: infinite delay, Long.MAX_VALUE, -1 after Kafka's toInt: nobody is throttled
    assert throttle_time(5.0, 0.0, 10_000) == 2**63 - 1


# -- hand-computed throttles through the managers --


def produce_quota(entity: QuotaEntity, rate: str) -> ClientQuotas:
    q = ClientQuotas()
    q.apply_entity_config(entity, {"producer_byte_rate": rate})
    return q


def test_produce_throttle_hand_computed():
    q = produce_quota(QuotaEntity(user="alice"), "1000")
    alice = KafkaPrincipal("User", "alice")
    assert q.record_produce(alice, "app", 5000, 0) == 0                 # 5000 / 10 s = 500 B/s
    # a second sample: 12000 B over 2500 + 8 * 1000 ms = 1142.857 B/s; (1142.857 - 1000) / 1000 * 10500
    assert q.record_produce(alice, "app", 7000, 2500) == 1500
    # bob has no quota: unlimited, never throttled
    assert q.record_produce(KafkaPrincipal("User", "bob"), "app", 10**9, 2500) == 0


def test_first_burst_throttle_is_spread_over_ten_seconds():
    q = produce_quota(QuotaEntity(client_id="app"), "1000")
    assert q.record_produce("alice", "app", 20_000, 0) == 10_000      # 2000 B/s over 10 s
    # same client id, same sensor: 20010 B -> 2001 B/s -> (2001 - 1000) / 1000 * 10000
    assert q.record_produce("bob", "app", 10, 0) == 10_010


def test_request_quota_is_bounded_to_one_window():
    q = ClientQuotas()
    q.apply_entity_config(QuotaEntity(user=DEFAULT), {"request_percentage": "10"})
    # 2 s of handler time = 200 percent-seconds over 10 s = 20 %; (20 - 10) / 10 * 10000 = 10000 -> 1000
    assert q.record_request("alice", "c", 2_000_000_000, 0) == 1000
    # 1.05 s of handler time: 10.5 %; (10.5 - 10) / 10 * 10000 = 500, under the cap
    q2 = ClientQuotas()
    q2.apply_entity_config(QuotaEntity(user=DEFAULT), {"request_percentage": "10"})
    assert q2.record_request("alice", "c", 1_050_000_000, 0) == 500


def test_zero_byte_rate_throttles_nobody_as_in_kafka():
    q = produce_quota(QuotaEntity(client_id=DEFAULT), "0")
    assert q.produce.record_and_get_throttle_time_ms("u", "c", 100, 0) == -1
    assert q.record_produce("u", "c", 100, 0) == 0                    # the facade never returns a negative time


def test_fetch_unrecord_and_max_bytes():
    q = ClientQuotas()
    q.apply_entity_config(QuotaEntity(client_id="c"), {"consumer_byte_rate": "100"})
    assert q.fetch_max_bytes("u", "c") == 100 * 10 * 1            # quota * (samples - 1) * window seconds
    assert q.fetch_max_bytes("u", "other") == 2**31 - 1
    assert q.record_fetch("u", "c", 3000, 0) == 20_000           # 300 B/s: (300 - 100) / 100 * 10000
    q.unrecord_fetch("u", "c", 3000, 0)
    assert q.record_fetch("u", "c", 0, 0) == 0


def test_no_quota_anywhere_records_nothing():
    q = ClientQuotas()
    assert not q.produce.quotas_enabled
    assert q.record_produce("u", "c", 10**12, 0) == 0
    assert list(q.sensors(0)) == []


def test_quota_change_keeps_samples_and_takes_new_bound():
    q = produce_quota(QuotaEntity(user="alice"), "10000")
    assert q.record_produce("alice", "x", 20_000, 0) == 0              # 2000 B/s
    q.apply_entity_config(QuotaEntity(user="alice"), {"producer_byte_rate": "1000"})
    assert q.record_produce("alice", "x", 0, 0) == 10_000
    q.apply_entity_config(QuotaEntity(user="alice"), {})
    assert q.record_produce("alice", "x", 0, 0) == 0


def test_sensors_expire_after_an_hour_idle():
    q = produce_quota(QuotaEntity(client_id=DEFAULT), "1000")
    q.record_produce("u", "c", 10, 0)
    assert [(s.user, s.client_id, s.bound) for s in q.sensors(0)] == [("", "c", 1000.0)]
    q.record_produce("u", "d", 10, 3_600_001 + 30_000)
    assert [s.client_id for s in q.sensors(3_700_000)] == ["d"]


# -- precedence --

LEVELS = [
    (QuotaEntity("alice", "app"), ("alice", "app")),
    (QuotaEntity("alice", DEFAULT), ("alice", "app")),
    (QuotaEntity("alice", None), ("alice", "")),
    (QuotaEntity(DEFAULT, "app"), ("alice", "app")),
    (QuotaEntity(DEFAULT, DEFAULT), ("alice", "app")),
    (QuotaEntity(DEFAULT, None), ("alice", "")),
    (QuotaEntity(None, "app"), ("", "app")),
    (QuotaEntity(None, DEFAULT), ("", "app")),
]


def test_eight_level_precedence_and_tags():
    m = ClientQuotaManager(PRODUCE)
    for i, (entity, _) in enumerate(LEVELS):
        m.update_quota(entity, 1000.0 + i)
    for i, (entity, tags) in enumerate(LEVELS):
        assert m.metric_tags("alice", "app") == tags, entity
        assert m.effective_quota("alice", "app") == 1000.0 + i, entity
        m.update_quota(entity, None)
    assert m.metric_tags("alice", "app") == ("", "app")
    assert m.effective_quota("alice", "app") is None
    assert m.quota_limit(("", "app")) == UNLIMITED


def test_precedence_is_per_quota_type():
    q = ClientQuotas()
    q.apply_entity_config(QuotaEntity("alice", "app"), {"consumer_byte_rate": "5"})
    q.apply_entity_config(QuotaEntity(None, "app"), {"producer_byte_rate": "7", "request_percentage": "12.5"})
    assert q.produce.effective_quota("alice", "app") == 7.0
    assert q.fetch.effective_quota("alice", "app") == 5.0
    assert q.request.effective_quota("alice", "app") == 12.5
    assert q.entity_config(QuotaEntity(None, "app")) == {"producer_byte_rate": "7", "request_percentage": "12.5"}


def test_user_tag_is_sanitized_client_tag_is_not():
    m = ClientQuotaManager(PRODUCE)
    m.update_quota(QuotaEntity("bob@x.com", "my app*"), 10.0)
    m.update_quota(QuotaEntity(None, "z"), 1.0)                          # two kinds: the full resolution
    assert m.metric_tags(KafkaPrincipal("User", "bob@x.com"), "my app*") == ("bob%40x.com", "my app*")
    assert m.effective_quota("bob@x.com", "my app*") == 10.0
    # a client id literally named "<default>" is a client id, not the default entity
    m.update_quota(QuotaEntity(None, "<default>"), 3.0)
    assert m.effective_quota("carol", "q") is None
    assert m.effective_quota("carol", "<default>") == 3.0


def test_single_kind_shortcuts():
    m = ClientQuotaManager(PRODUCE)
    m.update_quota(QuotaEntity("alice", None), 10.0)
    assert m.metric_tags("bob", "app") == ("bob", "")                   # UserQuotaEnabled: always (user, "")
    m2 = ClientQuotaManager(PRODUCE)
    m2.update_quota(QuotaEntity("alice", "x"), 10.0)
    m2.update_quota(QuotaEntity("alice", "x"), None)                   # removal still marks the kind enabled
    assert m2.quotas_enabled and m2.metric_tags("bob", "app") == ("bob", "app")


# -- bad input --


def test_bad_entity_and_values():
    with pytest.raises(ValueError):
        QuotaEntity(None, None)
    with pytest.raises(TypeError):
        QuotaEntity(5, None)
    q = ClientQuotas()
    with pytest.raises(ValueError, match="producer_byte_rate must be a long"):
        q.apply_entity_config(QuotaEntity("a"), {"producer_byte_rate": "1.5", "consumer_byte_rate": "3"})
    assert q.fetch.quota(QuotaEntity("a")) is None                     # nothing applied
    for bad in ("NaN", "x", "99999999999999999999", " 5", "1_000", "+", 5):
        with pytest.raises(ValueError, match="producer_byte_rate must be a long"):
            q.apply_entity_config(QuotaEntity("a"), {"producer_byte_rate": bad})
    for bad in ("x", "inf", "1_0", ""):
        with pytest.raises(ValueError, match="request_percentage must be a double"):
            q.apply_entity_config(QuotaEntity("a"), {"request_percentage": bad})
    assert q.fetch.quota(QuotaEntity("a")) is None
    q.apply_entity_config(QuotaEntity("a"), {"producer_byte_rate": "10", "unknown": "1"})   # other keys ignored
    with pytest.raises(ValueError):
        q.record_produce("a", "c", math.nan, 0)
    with pytest.raises(ValueError):
        q.record_produce("a", "c", math.inf, 0)
    with pytest.raises(TypeError):
        q.record_produce("a", "c", 1, 1.5)
    with pytest.raises(TypeError):
        q.record_produce(None, "c", 1, 0)
    with pytest.raises(ValueError, match="quota.window.num"):
        ClientQuotas.from_config({"quota.window.num": "0"}.get)
    with pytest.raises(ValueError, match="quota.window.size.seconds"):
        ClientQuotas.from_config({"quota.window.size.seconds": "x"}.get)
    assert ClientQuotas.from_config({"quota.window.num": "5"}.get).produce.samples == 5


def test_stored_nan_and_infinity_quotas_read_as_kafka_reads_them():
    # Kafka 3.7.1 stores "NaN" for request_percentage=NaN; its check is then never "acceptable" and the
    # throttle is Math.round(NaN) = 0. Infinity never throttles. A byte rate of Long.MAX_VALUE is a real quota.
    q = ClientQuotas()
    q.apply_entity_config(QuotaEntity("a"), {"request_percentage": "NaN", "producer_byte_rate": "9223372036854775807"})
    q.apply_entity_config(QuotaEntity("b"), {"request_percentage": " Infinity "})
    assert q.request.record_and_get_throttle_time_ms("a", "c", 10**6, 0) == 0
    assert q.request.record_and_get_throttle_time_ms("b", "c", 10**6, 0) == 0
    assert q.produce.effective_quota("a", "c") == 2.0**63
    assert q.produce.max_value_in_quota_window("a", "c") == 2.0**63 * 10


def test_huge_values_do_not_crash():
    q = produce_quota(QuotaEntity(None, DEFAULT), "1")
    t = q.produce.record_and_get_throttle_time_ms("u", "c", 1e300, 0)
    assert t == -1                                                      # Long.MAX_VALUE narrowed, as Kafka
    assert q.record_produce("u", "c", 1, 0) == 0
    q2 = produce_quota(QuotaEntity(None, DEFAULT), "1")
    assert q2.record_produce("u", "c", 10**6, 0) == java_long_to_int(round((10**5 - 1) * 10_000))


# -- against Kafka 3.7.1's own classes --

PROBE = r"""package kafka.server;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import org.apache.kafka.common.metrics.Metrics;
import org.apache.kafka.common.metrics.MetricConfig;
import org.apache.kafka.common.metrics.Quota;
import org.apache.kafka.common.metrics.stats.Rate;
import org.apache.kafka.common.security.auth.KafkaPrincipal;
import org.apache.kafka.common.utils.Sanitizer;
import org.apache.kafka.common.utils.Time;
import kafka.network.RequestChannel;
import scala.Option;

// Drives Kafka 3.7.1's own ClientQuotaManager / ClientRequestQuotaManager / Rate from tab-separated commands.
public class PykQuotaProbe {
    static long NOW = 0;
    static final Time CLOCK = new Time() {
        public long milliseconds() { return NOW; }
        public long nanoseconds() { return NOW * 1000000L; }
        public void sleep(long ms) { NOW += ms; }
        public void waitObject(Object o, java.util.function.Supplier<Boolean> c, long deadline) { }
    };
    static Option<String> opt(String s) { return s.equals("-") ? Option.empty() : Option.apply(s); }
    static Option<String> sanitized(String s) {
        if (s.equals("-")) return Option.empty();
        if (s.equals("*")) return Option.apply("<default>");
        return Option.apply(Sanitizer.sanitize(s));
    }
    static Option<String> raw(String s) {
        if (s.equals("-")) return Option.empty();
        if (s.equals("*")) return Option.apply("<default>");
        return Option.apply(s);
    }
    public static void main(String[] args) {
        try {
            run();
        } catch (Throwable t) {
            t.printStackTrace();
            System.exit(1);
        }
    }
    static void run() throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        ClientQuotaManager m = null;
        Metrics metrics = null;
        Rate rate = null;
        MetricConfig rc = null;
        ControllerMutationQuota cur = null;
        StringBuilder out = new StringBuilder();
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) continue;
            String[] f = line.split("\t", -1);
            switch (f[0]) {
                case "new": {
                    if (m != null) m.shutdown();
                    metrics = new Metrics(Time.SYSTEM);
                    ClientQuotaManagerConfig c = new ClientQuotaManagerConfig(Integer.parseInt(f[2]), Integer.parseInt(f[3]));
                    if (f[1].equals("Request")) m = new ClientRequestQuotaManager(c, metrics, Time.SYSTEM, "", Option.empty());
                    else m = new ClientQuotaManager(c, metrics, f[1].equals("Produce") ? QuotaType.Produce$.MODULE$ : QuotaType.Fetch$.MODULE$, Time.SYSTEM, "", Option.empty());
                    break;
                }
                case "quota": {
                    Option<Quota> q = f[3].equals("none") ? Option.empty() : Option.apply(new Quota(Double.parseDouble(f[3]), true));
                    m.updateQuota(sanitized(f[1]), raw(f[2]), sanitized(f[2]), q);
                    break;
                }
                case "rec": {
                    RequestChannel.Session s = new RequestChannel.Session(new KafkaPrincipal("User", f[1]), InetAddress.getLoopbackAddress());
                    int t = m.maybeRecordAndGetThrottleTimeMs(s, f[2], Double.parseDouble(f[3]), Long.parseLong(f[4]));
                    scala.collection.immutable.Map<String, String> tags = m.getOrCreateQuotaSensors(s, f[2]).metricTags();
                    out.append(t).append('\t').append(tags.apply("user")).append('\t').append(tags.apply("client-id")).append('\n');
                    break;
                }
                case "max": {
                    RequestChannel.Session s = new RequestChannel.Session(new KafkaPrincipal("User", f[1]), InetAddress.getLoopbackAddress());
                    out.append(m.getMaxValueInQuotaWindow(s, f[2])).append('\n');
                    break;
                }
                case "cnew": {
                    if (m != null) m.shutdown();
                    metrics = new Metrics(CLOCK);
                    ClientQuotaManagerConfig c = new ClientQuotaManagerConfig(Integer.parseInt(f[1]), Integer.parseInt(f[2]));
                    m = new ControllerMutationQuotaManager(c, metrics, CLOCK, "", Option.empty());
                    break;
                }
                case "cq": {   // cq <user> <client> strict|permissive <now>
                    NOW = Long.parseLong(f[4]);
                    RequestChannel.Session s = new RequestChannel.Session(new KafkaPrincipal("User", f[1]), InetAddress.getLoopbackAddress());
                    ControllerMutationQuotaManager cm = (ControllerMutationQuotaManager) m;
                    cur = f[3].equals("strict") ? cm.newStrictQuotaFor(s, f[2]) : cm.newPermissiveQuotaFor(s, f[2]);
                    break;
                }
                case "crec": {   // crec <permits> <now>
                    NOW = Long.parseLong(f[2]);
                    try {
                        cur.record(Double.parseDouble(f[1]));
                        out.append("OK");
                    } catch (org.apache.kafka.common.errors.ThrottlingQuotaExceededException e) {
                        out.append("THROTTLED ").append(e.throttleTimeMs()).append(' ').append(e.getMessage());
                    }
                    out.append('\t').append(cur.isExceeded()).append('\t').append(cur.throttleTime()).append('\n');
                    break;
                }
                case "rate": {   // rate <samples> <window ms>
                    rc = new MetricConfig().samples(Integer.parseInt(f[1])).timeWindow(Long.parseLong(f[2]), java.util.concurrent.TimeUnit.MILLISECONDS);
                    rate = new Rate();
                    break;
                }
                case "rrec": rate.record(rc, Double.parseDouble(f[1]), Long.parseLong(f[2])); break;
                case "rmeasure": {
                    long now = Long.parseLong(f[1]);
                    double v = rate.measure(rc, now);
                    out.append(Double.toString(v)).append('\t').append(rate.windowSize(rc, now)).append('\n');
                    break;
                }
                default: throw new IllegalArgumentException(line);
            }
        }
        System.out.print(out);
        System.out.flush();
        System.exit(0);
    }
}
"""


@pytest.fixture(scope="module")
def kafka_quotas(tmp_path_factory):
    from tests.unit.test_security_jaas import kafka_java_probe

    java = kafka_java_probe(tmp_path_factory.mktemp("quota-probe"), PROBE, "kafka.server.PykQuotaProbe", ["*"])

    def run(lines: list[str]) -> list[str]:
        done = subprocess.run(java, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.splitlines()
    return run


def _entity(u: str, c: str) -> QuotaEntity:
    part = {"-": None, "*": DEFAULT}
    return QuotaEntity(part.get(u, u), part.get(c, c))


def _scenario(seed: int) -> tuple[list[str], list[str]]:
    rnd = random.Random(seed)
    kind = rnd.choice([PRODUCE, FETCH, REQUEST])
    samples, window_s = rnd.choice([(11, 1), (3, 2), (1, 1), (5, 1)])
    users, clients = ["alice", "bob@x.com", "c d"], ["app", "my app*", "x"]
    lines = [f"new\t{kind}\t{samples}\t{window_s}"]
    ours = []
    m = ClientQuotaManager(kind, samples=samples, window_seconds=window_s,
                           max_throttle_ms=window_s * 1000 if kind == REQUEST else None)
    now = rnd.randrange(0, 5000)
    for _ in range(120):
        if rnd.random() < 0.15:
            u = rnd.choice(users + ["*", "-"])
            c = rnd.choice(clients + ["*", "-"]) if u != "-" else rnd.choice(clients + ["*"])
            value = None if rnd.random() < 0.2 else float(rnd.choice([0, 1, 50, 500, 1000, 2500.5, 10**6, -5,
                                                                      "nan", 2**63 - 1]))
            text = "none" if value is None else "NaN" if value != value else repr(value)
            lines.append(f"quota\t{u}\t{c}\t{text}")
            m.update_quota(_entity(u, c), value)
        else:
            now += rnd.choice([0, 1, 7, 100, 999, 1000, 1500, 4000, 12_000, 40_000])
            u, c = rnd.choice(users), rnd.choice(clients)
            v = float(rnd.choice([0, 1, 10, 100, 999, 5000, 123_456, -50]))
            lines.append(f"rec\t{u}\t{c}\t{v!r}\t{now}")
            t = m.record_and_get_throttle_time_ms(u, c, v, now)
            ours.append(f"{t}\t{m.metric_tags(u, c)[0]}\t{m.metric_tags(u, c)[1]}")
            if rnd.random() < 0.1:
                lines.append(f"max\t{u}\t{c}")
                mv = m.max_value_in_quota_window(u, c)
                ours.append(repr(float(mv)))
    return lines, ours


def test_managers_match_kafka(kafka_quotas):
    all_lines, all_ours = [], []
    for seed in range(60):
        lines, ours = _scenario(seed)
        all_lines += lines
        all_ours += ours
    # a "max" line is a double that Java prints its own way ("1.0E7"): compare those as numbers
    theirs = [line if "\t" in line else repr(float(line)) for line in kafka_quotas(all_lines)]
    assert len(theirs) == len(all_ours)
    mismatches = [(i, a, b) for i, (a, b) in enumerate(zip(all_ours, theirs)) if a != b]
    assert not mismatches[:5]
    assert sum(1 for line in all_ours if not line.startswith(("0\t", "-"))) > 50   # real throttles compared


def test_rate_matches_kafka(kafka_quotas):
    rnd = random.Random(7)
    lines, ours = [], []
    for _ in range(30):
        samples, window = rnd.choice([(11, 1000), (2, 500), (1, 1000), (4, 30)])
        r = Rate(samples, window)
        lines.append(f"rate\t{samples}\t{window}")
        now = rnd.randrange(0, 100_000)
        for _ in range(40):
            now += rnd.choice([0, 1, 29, 30, 499, 500, 1000, 3000, 50_000])
            if rnd.random() < 0.6:
                v = float(rnd.randrange(0, 10_000))
                r.record(v, now)
                lines.append(f"rrec\t{v!r}\t{now}")
            else:
                lines.append(f"rmeasure\t{now}")
                ours.append((r.measure(now), r.window_size(now)))
    theirs = kafka_quotas(lines)
    assert len(theirs) == len(ours)
    for (value, window), line in zip(ours, theirs):
        jv, jw = line.split("\t")
        assert (value, window) == (float(jv), int(jw))


# -- controller mutation quota (KIP-599) --

T0 = 1_700_000_000_000   # wall-clock ms, as Kafka's time.milliseconds(): the bucket starts full


def test_strict_mutation_quota_hand_computed():
    m = ControllerMutationQuotaManager()
    m.update_quota(QuotaEntity(user=DEFAULT), 2.0)                    # 2 partitions/s, burst 11 * 1 * 2 = 22
    q = m.new_quota_for("CreateTopics", 6, "alice", "c", T0)
    assert q.strict
    q.record(30, T0)                                                   # allowed: the bucket was not below 0
    assert m.tokens("alice", "c", T0) == -8.0
    with pytest.raises(ThrottlingQuotaExceeded) as e:
        q.record(1, T0)
    assert (e.value.throttle_ms, e.value.error_code, str(e.value)) == (4000, 89, "The throttling quota has been exceeded.")
    assert q.is_exceeded and q.throttle_time(T0 + 1500) == 2500      # counts down
    q2 = m.new_quota_for("CreateTopics", 6, "alice", "c", T0 + 4000)
    q2.record(1, T0 + 4000)                                            # refilled to 0 by then
    assert not q2.is_exceeded and q2.throttle_time(T0 + 4000) == 0


def test_permissive_mutation_quota_and_unbounded():
    m = ControllerMutationQuotaManager()
    assert m.new_quota_for("DeleteTopics", 4, "a", "c", T0).record(10**6, T0) is None   # no quotas: unbounded
    m.update_quota(QuotaEntity(client_id="c"), 1.0)
    q = m.new_quota_for("DeleteTopics", 4, "a", "c", T0)
    assert not q.strict
    q.record(15, T0)                                                   # 11 - 15 = -4: accepted, throttled 4 s
    q.record(1, T0)
    assert not q.is_exceeded and q.throttle_time(T0) == 5000
    assert m.record_and_get_throttle_time_ms("a", "c", 1, T0) == 5000  # the manager's own check-then-record
    assert ClientQuotas().controller_mutation.quotas_enabled is False
    cq = ClientQuotas()
    cq.apply_entity_config(QuotaEntity(client_id="c"), {"controller_mutation_rate": "1.5"})
    assert cq.controller_mutation.effective_quota("u", "c") == 1.5


def _mutation_scenario(seed: int) -> tuple[list[str], list[str]]:
    rnd = random.Random(seed)
    samples, window_s = rnd.choice([(11, 1), (3, 2), (1, 1)])
    lines = [f"cnew\t{samples}\t{window_s}"]
    ours: list[str] = []
    m = ControllerMutationQuotaManager(samples=samples, window_seconds=window_s)
    now = T0 + rnd.randrange(0, 5000)
    quota = None
    for _ in range(80):
        r = rnd.random()
        if r < 0.15:
            u, c = rnd.choice(["alice", "*", "-"]), rnd.choice(["app", "*", "-"])
            if u == "-" and c == "-":
                c = "app"
            value = None if rnd.random() < 0.2 else float(rnd.choice([0.5, 1, 2, 10, 0]))
            lines.append(f"quota\t{u}\t{c}\t{'none' if value is None else repr(value)}")
            m.update_quota(_entity(u, c), value)
        elif r < 0.35 or quota is None:
            strict = rnd.random() < 0.6
            u, c = rnd.choice(["alice", "bob"]), rnd.choice(["app", "x"])
            lines.append(f"cq\t{u}\t{c}\t{'strict' if strict else 'permissive'}\t{now}")
            quota = m.new_quota(u, c, strict=strict, now_ms=now)
        else:
            now += rnd.choice([0, 0, 1, 10, 250, 1000, 3000, 20_000])
            permits = float(rnd.choice([1, 1, 3, 10, 30]))
            lines.append(f"crec\t{permits!r}\t{now}")
            try:
                quota.record(permits, now)
                head = "OK"
            except ThrottlingQuotaExceeded as e:
                head = f"THROTTLED {e.throttle_ms} {e}"
            ours.append(f"{head}\t{str(quota.is_exceeded).lower()}\t{quota.throttle_time(now)}")
    return lines, ours


def test_mutation_quota_matches_kafka(kafka_quotas):
    lines, ours = [], []
    for seed in range(40):
        more_lines, more_ours = _mutation_scenario(seed)
        lines += more_lines
        ours += more_ours
    theirs = kafka_quotas(lines)
    assert len(theirs) == len(ours)
    assert [(i, a, b) for i, (a, b) in enumerate(zip(ours, theirs)) if a != b][:5] == []
    assert sum(1 for line in ours if line.startswith("THROTTLED")) > 20
