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
