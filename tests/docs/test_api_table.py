"""docs/operations.md lists exactly the Kafka APIs the broker advertises, at the versions it
advertises (tests/docs/api_table.py regenerates the table from the code)."""
from api_table import OPERATIONS, notes_of, regenerated, table_span

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
