"""The pipeline's pure-Python parts: event format, replay offset ranges, triggers, connector-jar checks.

No Spark, no broker: these run everywhere.
"""

from __future__ import annotations

import json

import pytest

from city_pipeline.cli import trigger_kwargs
from city_pipeline.events import CITIES, CityEvent, iso_millis, make_events, parse_time_ms
from city_pipeline.replay import EARLIEST, LATEST, offsets_json, parse_partition_offsets, replay_options
from city_pipeline.session import ConnectorJarsError, connector_package, find_connector_jars

START_MS = 1_795_000_000_000  # 2026-11-18T...Z, a whole second


# -- events -------------------------------------------------------------------------------------------


def test_events_are_deterministic_per_seed_and_keyed_by_city():
    first = make_events(200, start_ms=START_MS, seed=7, max_lateness_ms=5000)
    assert first == make_events(200, start_ms=START_MS, seed=7, max_lateness_ms=5000)
    assert first != make_events(200, start_ms=START_MS, seed=8, max_lateness_ms=5000)
    assert {event.city for event in first} == set(CITIES)
    for event in first:
        assert event.key == event.city.encode()
        assert json.loads(event.value)["city"] == event.city


def test_event_times_follow_slots_within_the_lateness_bound():
    events = make_events(500, start_ms=START_MS, step_ms=250, seed=3, max_lateness_ms=4000)
    lateness = [START_MS + i * 250 - event.event_time_ms for i, event in enumerate(events)]
    assert min(lateness) >= 0 and max(lateness) <= 4000
    assert max(lateness) > 0, "a lateness bound of 4 s should make some events late"
    on_time = make_events(50, start_ms=START_MS, step_ms=250)
    assert [e.event_time_ms for e in on_time] == [START_MS + i * 250 for i in range(50)]


def test_event_value_is_the_documented_json():
    event = CityEvent("e-000001", "Oslo", "click", 12.5, START_MS + 1250)
    assert json.loads(event.value) == {"event_id": "e-000001", "city": "Oslo", "kind": "click", "amount": 12.5,
                                       "event_time": iso_millis(START_MS + 1250)}
    assert iso_millis(0) == "1970-01-01T00:00:00.000Z"
    assert iso_millis(1250) == "1970-01-01T00:00:01.250Z"


@pytest.mark.parametrize("text, expected", [
    ("1795000000000", 1_795_000_000_000),
    ("1970-01-01T00:00:01.250Z", 1250),
    ("1970-01-01T01:00:00+01:00", 0),
    ("1970-01-01T00:01:00", 60_000),  # no zone: UTC
])
def test_parse_time_ms(text, expected):
    assert parse_time_ms(text) == expected


def test_make_events_rejects_nonsense():
    with pytest.raises(ValueError):
        make_events(-1, start_ms=0)
    with pytest.raises(ValueError):
        make_events(3, start_ms=0, cities=[])


# -- replay ranges ------------------------------------------------------------------------------------


def test_parse_partition_offsets():
    assert parse_partition_offsets("0:120, 2:earliest,1:latest") == {0: 120, 2: EARLIEST, 1: LATEST}
    for bad in ("", "0", "a:1", "0:x", "0:1,0:2", "-1:5", "0:-3"):
        with pytest.raises(ValueError):
            parse_partition_offsets(bad)


def test_offsets_json_names_every_partition():
    assert json.loads(offsets_json("t", [2, 0, 1], {1: 40}, EARLIEST)) == {"t": {"0": -2, "1": 40, "2": -2}}
    with pytest.raises(ValueError, match="no partition"):
        offsets_json("t", [0, 1], {5: 1}, LATEST)


def test_replay_options_default_is_the_whole_topic():
    assert replay_options("t", [0, 1, 2]) == {"subscribe": "t", "startingOffsets": "earliest",
                                              "endingOffsets": "latest"}


def test_replay_options_with_offsets_fill_unnamed_partitions_with_open_ends():
    options = replay_options("t", [0, 1, 2], from_offsets={0: 10, 2: 5}, to_offsets={0: 20})
    assert options["subscribe"] == "t"
    assert json.loads(options["startingOffsets"]) == {"t": {"0": 10, "1": EARLIEST, "2": 5}}
    assert json.loads(options["endingOffsets"]) == {"t": {"0": 20, "1": LATEST, "2": LATEST}}


def test_replay_options_only_listed_assigns_the_named_partitions():
    options = replay_options("t", [0, 1, 2], from_offsets={2: 5}, to_offsets={0: 9}, only_listed=True)
    assert json.loads(options["assign"]) == {"t": [0, 2]}
    assert "subscribe" not in options
    assert json.loads(options["startingOffsets"]) == {"t": {"0": EARLIEST, "2": 5}}
    assert json.loads(options["endingOffsets"]) == {"t": {"0": 9, "2": LATEST}}
    with pytest.raises(ValueError):
        replay_options("t", [0, 1], from_offsets={7: 1}, only_listed=True)


def test_replay_options_by_timestamp():
    options = replay_options("t", [0], from_timestamp_ms=1000, to_timestamp_ms=5000)
    assert options == {"subscribe": "t", "startingTimestamp": "1000",
                       "startingOffsetsByTimestampStrategy": "latest", "endingTimestamp": "5000"}


@pytest.mark.parametrize("kwargs, message", [
    ({"from_offsets": {0: 1}, "from_timestamp_ms": 5}, "not both"),
    ({"to_offsets": {0: 1}, "to_timestamp_ms": 5}, "not both"),
    ({"from_offsets": {0: LATEST}}, "cannot start at latest"),
    ({"to_offsets": {0: EARLIEST}}, "cannot end at earliest"),
    ({"from_offsets": {0: 9}, "to_offsets": {0: 3}}, "after end offset"),
    ({"from_timestamp_ms": 9, "to_timestamp_ms": 3}, "after end timestamp"),
    ({"from_timestamp_ms": -5}, "epoch milliseconds"),
    ({"from_offsets": {3: 0}}, "no partition"),
])
def test_replay_options_refuse_ranges_spark_would_reject_or_misread(kwargs, message):
    with pytest.raises(ValueError, match=message):
        replay_options("t", [0, 1], **kwargs)


# -- triggers -----------------------------------------------------------------------------------------


def test_trigger_kwargs():
    assert trigger_kwargs("available-now") == {"availableNow": True}
    assert trigger_kwargs("AvailableNow") == {"availableNow": True}
    assert trigger_kwargs("10 seconds") == {"processingTime": "10 seconds"}
    with pytest.raises(ValueError):
        trigger_kwargs("  ")


# -- connector jars -----------------------------------------------------------------------------------


def _jar_dir(tmp_path, names):
    for name in names:
        (tmp_path / name).write_bytes(b"")
    return tmp_path


FULL_40 = ["spark-sql-kafka-0-10_2.13-4.0.1.jar", "spark-token-provider-kafka-0-10_2.13-4.0.1.jar",
           "kafka-clients-3.9.0.jar", "commons-pool2-2.12.0.jar"]


def test_connector_jars_found_for_matching_spark(tmp_path):
    jars = find_connector_jars(_jar_dir(tmp_path, FULL_40 + ["spark-sql-kafka-0-10_2.13-4.0.1-sources.jar"]),
                               "4.0.0")
    assert sorted(path.name for path in jars) == sorted(FULL_40)


def test_connector_jars_include_what_an_unshaded_kafka_clients_needs(tmp_path):
    extras = ["opentelemetry-proto-1.0.0-alpha.jar", "protobuf-java-3.23.4.jar"]
    jars = find_connector_jars(_jar_dir(tmp_path, FULL_40 + extras + ["slf4j-api-2.0.9.jar"]), "4.0.0")
    assert sorted(path.name for path in jars) == sorted(FULL_40 + extras)


def test_connector_jars_in_sparks_ivy_cache_layout(tmp_path):
    names = ["org.apache.spark_spark-sql-kafka-0-10_2.13-4.0.1.jar",
             "org.apache.spark_spark-token-provider-kafka-0-10_2.13-4.0.1.jar",
             "org.apache.kafka_kafka-clients-3.9.0.jar", "org.apache.commons_commons-pool2-2.12.0.jar",
             "org.lz4_lz4-java-1.8.0.jar"]
    jars = find_connector_jars(_jar_dir(tmp_path, names), "4.0.1")
    assert sorted(path.name for path in jars) == sorted(names[:4])


def test_connector_jars_pick_the_version_that_matches_spark(tmp_path):
    names = FULL_40 + ["spark-sql-kafka-0-10_2.13-4.1.0.jar", "spark-token-provider-kafka-0-10_2.13-4.1.0.jar"]
    jars = {path.name for path in find_connector_jars(_jar_dir(tmp_path, names), "4.1.1")}
    assert {"spark-sql-kafka-0-10_2.13-4.1.0.jar", "spark-token-provider-kafka-0-10_2.13-4.1.0.jar"} <= jars


def test_connector_jars_minor_mismatch_is_named(tmp_path):
    with pytest.raises(ConnectorJarsError, match=r"must be 4\.1\.x to match Spark 4\.1\.0.*4\.0\.1"):
        find_connector_jars(_jar_dir(tmp_path, FULL_40), "4.1.0")


def test_connector_jars_missing_and_old_are_named(tmp_path):
    names = [FULL_40[0], FULL_40[1], "commons-pool2-2.11.1.jar"]
    with pytest.raises(ConnectorJarsError) as excinfo:
        find_connector_jars(_jar_dir(tmp_path, names), "4.0.1")
    assert "no kafka-clients jar" in str(excinfo.value)
    assert "commons-pool2 must be >= 2.12" in str(excinfo.value)
    with pytest.raises(ConnectorJarsError, match="not a directory"):
        find_connector_jars(tmp_path / "absent", "4.0.1")


def test_connector_package_matches_spark_version():
    assert connector_package("4.0.1") == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.1"
