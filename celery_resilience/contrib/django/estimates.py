"""Counts that don't read a million rows: PostgreSQL's estimates, exact where they are small.

A ``COUNT(*)`` reads every row it counts (PostgreSQL keeps no row count), some 50-100 ms at a
million rows of this table; ``SELECT DISTINCT breaker`` reads the whole index. The admin's list
does both on every page load, and ``breakers()`` on every drain pass. What they use instead:

- the table's rows: the planner's own estimate, ``reltuples`` per page at the last ``ANALYZE``
  times the table's pages now (so it follows a growing table between analyzes);
- a filtered list's rows: the planner's estimate of that query (``EXPLAIN``);
- the distinct breakers: a walk of the ``breaker`` index, one probe per name.

Each is exact below ``EXACT_BELOW`` rows (counted then), and ``None`` on other databases (their
callers count).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property

#: Fewer rows than this (by the estimate) are counted exactly: a count that small is quick.
EXACT_BELOW = 100_000

#: Fewer pages than this at the last ``ANALYZE``: no estimate. The rows per page of a table
#: that small may be far from what its pages hold now (its last page was partly filled then).
MIN_PAGES = 100

_TABLE_ROWS = (
    f"SELECT CASE WHEN c.reltuples < 0 OR c.relpages < {MIN_PAGES} THEN NULL ELSE"
    " c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int)"
    " END FROM pg_class c WHERE c.oid = %s::regclass"
)
# A loose index scan: each step asks the index for the next name after the last one.
_DISTINCT = """
WITH RECURSIVE names(name) AS (
  (SELECT {col} FROM {table} ORDER BY {col} LIMIT 1)
  UNION ALL
  SELECT (SELECT {col} FROM {table} WHERE {col} > names.name ORDER BY {col} LIMIT 1)
  FROM names WHERE names.name IS NOT NULL
) SELECT name FROM names WHERE name IS NOT NULL
"""


def estimated_rows(model: Any, using: str) -> int | None:
    """PostgreSQL's estimate of the rows of ``model``'s table; ``None`` where it has none
    (another database, a table never analyzed or smaller than ``MIN_PAGES`` then)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(_TABLE_ROWS, [connection.ops.quote_name(model._meta.db_table)])
        row = cursor.fetchone()
    return None if row is None or row[0] is None else int(row[0])


def estimated_count(queryset: Any) -> int | None:
    """PostgreSQL's estimate of the rows of ``queryset``; ``None`` on other databases."""
    if connections[queryset.db].vendor != "postgresql":
        return None
    if not queryset.query.where:
        return estimated_rows(queryset.model, queryset.db)
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return int(plan[0]["Plan"]["Plan Rows"])


def distinct_values(model: Any, using: str, column: str) -> list[str] | None:
    """The distinct values of an indexed ``column``, one index probe each on PostgreSQL;
    ``None`` on other databases."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    quote = connection.ops.quote_name
    sql = _DISTINCT.format(col=quote(column), table=quote(model._meta.db_table))
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [row[0] for row in cursor.fetchall()]


class EstimatedPaginator(Paginator):
    """A paginator whose count is PostgreSQL's estimate once that passes ``EXACT_BELOW``
    (``estimated`` says so, and the page shows "about"); exact below it, and elsewhere."""

    estimated = False

    @cached_property
    def count(self) -> int:
        estimate = estimated_count(self.object_list)
        if estimate is None or estimate < EXACT_BELOW:
            return int(self.object_list.count())
        self.estimated = True
        return estimate
