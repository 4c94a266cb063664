"""The field declarations are consistent: what they say is required, fed or JSON is possible."""

from __future__ import annotations

import pytest

from trajlake.schemas.fields import EVENT_TYPES, FIELDS, EventField
from trajlake.schemas.tables import PROJECTION_TABLES, TABLE_SCHEMAS


@pytest.mark.parametrize("field", FIELDS, ids=[f.name for f in FIELDS])
def test_each_declaration_is_consistent(field: EventField) -> None:
    assert set(field.carried_by) <= set(EVENT_TYPES)
    assert set(field.required_by) <= set(field.carried_by), "a type cannot require a field it does not carry"
    for feed in field.feeds:
        assert feed.table in PROJECTION_TABLES
        assert feed.source is None or feed.source in field.carried_by
        assert (feed.column or field.name) in TABLE_SCHEMAS[feed.table].names


def test_field_names_are_unique() -> None:
    names = [f.name for f in FIELDS]
    assert len(names) == len(set(names))


def test_every_column_of_every_table_says_what_it_means() -> None:
    """The table reference (docs/reference/tables.md) has a meaning for each column, view columns
    included, and no meaning outlives its column."""
    from trajlake.schemas.tables import COLUMN_DOCS, TABLE_DOCS, TOKEN_VIEW_COLUMNS, column_doc
    from trajlake.store.tables import SCHEMAS

    undocumented, stale = [], []
    for table, schema in SCHEMAS.items():
        columns = [*schema.names, *TOKEN_VIEW_COLUMNS.get(table, ())]
        undocumented += [f"{table}.{c}" for c in columns if not column_doc(table, c)]
        stale += [f"{table}.{c}" for c in COLUMN_DOCS.get(table, {}) if c not in columns]
    assert undocumented == [] and stale == []
    assert set(TABLE_DOCS) == set(SCHEMAS)


def test_every_event_type_and_field_says_what_it_is_for() -> None:
    from trajlake.schemas.fields import EVENT_TYPE_DOCS, EVENT_TYPES, FIELDS

    assert set(EVENT_TYPE_DOCS) == set(EVENT_TYPES)
    assert [f.name for f in FIELDS if len(f.doc) < 10] == []
