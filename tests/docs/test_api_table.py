"""docs/operations.md lists exactly the Kafka APIs the broker advertises, at the versions it
advertises, and docs/compatibility.md each Kafka API beside them (tests/docs/api_table.py
regenerates both tables from the code); docs/coming-from-kafka.md names exactly the client APIs
not served."""
import re

from api_table import COMPATIBILITY, OPERATIONS, not_served, notes_of, regenerated, regenerated_compat, table_span

from oncelog.protocol.api import BROKER_VERSIONS


def test_the_api_table_is_the_served_versions():
    text = OPERATIONS.read_text()
    assert regenerated(text) == text, ("docs/operations.md's API table differs from BROKER_VERSIONS: run "
                                       ".venv/bin/python tests/docs/api_table.py and write the notes of new APIs")


def test_every_served_api_has_notes_and_no_other_api_is_listed():
    text = OPERATIONS.read_text()
    notes = notes_of(text)
    start, end = table_span(text)
    assert len(text[start:end].splitlines()) == 2 + len(BROKER_VERSIONS)
    assert all(notes.values()), [name for name, n in notes.items() if not n]


def test_the_compatibility_table_is_the_served_versions():
    """It said AddPartitionsToTxn 0-4, EndTxn 0-3, TxnOffsetCommit 0-3 and UpdateFeatures not
    served while the broker served 0-5, 0-5, 0-5 and 0-2 (issue 39, item 7)."""
    text = COMPATIBILITY.read_text()
    assert regenerated_compat(text) == text, ("docs/compatibility.md's API table differs from BROKER_VERSIONS: "
                                              "run .venv/bin/python tests/docs/api_table.py")


def test_coming_from_kafka_names_every_api_not_served():
    text = (COMPATIBILITY.parent / "coming-from-kafka.md").read_text()
    section = text[text.index("## APIs not served"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    listed = re.findall(r"^\| (\w+) \(\d+\) \|", section, re.M)
    assert listed == not_served()


def test_the_compatibility_count_of_served_apis():
    from api_table import BROKER_VERSIONS, CONTROLLER_ONLY, INTER_BROKER, kafka_apis
    client = len([k for k in kafka_apis() if k not in CONTROLLER_ONLY | INTER_BROKER])
    assert f"oncelog serves {len(BROKER_VERSIONS)} of the {client} APIs" in COMPATIBILITY.read_text()
