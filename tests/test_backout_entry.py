"""ParkedTask, its encoding and the Lua script headers: pure, no Redis."""

from __future__ import annotations

import contextlib
import datetime
import json
import pickle
import re
import uuid
from decimal import Decimal
from importlib import resources
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_resilience.backout.body import readable
from celery_resilience.backout.codec import decode, encode
from celery_resilience.backout.entry import (
    REASONS,
    STATUSES,
    UNDECODABLE_TASK,
    ParkedTask,
    cut_traceback,
    undecodable,
)
from celery_resilience.errors import ConfigurationError, ResilienceError, UndecodableEntry

pytestmark = pytest.mark.unit


class PaymentDeclined(Exception):
    pass


def make(**changes: Any) -> ParkedTask:
    entry = ParkedTask.new(
        task_name="shop.charge",
        task_id=str(uuid.uuid4()),
        args=[1, "zwölf ✓", {"nested": [1, 2.5, None, True, {"deep": ["x"]}]}],
        kwargs={"order": "A-1", "items": [{"sku": "ü", "qty": 2}]},
        options={"queue": "payments", "routing_key": "pay", "priority": 5, "headers": {"h": 1}},
        breaker="payments",
        reason="breaker_open",
        exc_type="builtins.ConnectionError",
        exc_message="refused",
        traceback="Traceback...\n",
        retries=3,
        replays=1,
        parked_at=1_700_000_000.123456,
        due_at=1_700_000_030.5,
    )
    return entry.replace(**changes) if changes else entry


def test_new_fills_a_fresh_uuid4_hex_id_and_defaults() -> None:
    a = ParkedTask.new(task_name="t", task_id="tid", reason="park_on", parked_at=10.0)
    b = ParkedTask.new(task_name="t", task_id="tid", reason="park_on")
    assert a.id != b.id
    assert uuid.UUID(hex=a.id).version == 4
    assert len(a.id) == 32
    assert (a.args, a.kwargs, a.options, a.breaker) == ([], {}, {}, None)
    assert (a.status, a.dead_reason, a.retries, a.replays) == ("parked", None, 0, 0)
    assert a.due_at == a.parked_at == 10.0
    assert b.parked_at > 1_600_000_000


def test_new_describes_an_exception_with_its_traceback() -> None:
    try:
        raise PaymentDeclined("card refused")
    except PaymentDeclined as exc:
        entry = ParkedTask.new(task_name="t", task_id="i", reason="park_on", exc=exc)
    assert entry.exc_type == f"{__name__}.PaymentDeclined"
    assert entry.exc_message == "card refused"
    assert "raise PaymentDeclined" in entry.traceback
    builtin = ParkedTask.new(task_name="t", task_id="i", reason="park_on", exc=TimeoutError("x"))
    assert builtin.exc_type == "TimeoutError"


def test_new_cuts_a_long_traceback() -> None:
    entry = ParkedTask.new(task_name="t", task_id="i", reason="park_on", traceback="x\n" * 10_000)
    assert len(entry.traceback) <= 8192


def test_fields_are_validated_on_construction_and_replace() -> None:
    entry = make()
    with pytest.raises(ValueError, match="reason"):
        entry.replace(reason="bored")
    with pytest.raises(ValueError, match="status"):
        entry.replace(status="sleeping")
    with pytest.raises(TypeError, match="args"):
        entry.replace(args=(1, 2))
    with pytest.raises(ValueError, match="retries"):
        entry.replace(retries=True)
    with pytest.raises(ValueError, match="parked_at"):
        entry.replace(parked_at=float("nan"))
    assert entry.replace(status="dead", dead_reason="max_replays").status == "dead"


def test_reasons_and_statuses() -> None:
    assert REASONS == (
        "breaker_open",
        "retries_exhausted",
        "park_on",
        "delay_too_long",
        "redelivered",
        "retry_budget",
    )
    assert STATUSES == ("parked", "dead")
    assert issubclass(UndecodableEntry, ResilienceError)


# -- encoding -------------------------------------------------------------------------------


def test_json_round_trip_keeps_every_field() -> None:
    entry = make(breaker=None, status="dead", dead_reason="unregistered")
    data = encode(entry, "json")
    assert data.startswith(b"2;json;-\n")
    assert decode(data) == entry
    assert decode(data, ["json"]) == entry


def test_json_round_trip_of_kombu_extended_types() -> None:
    when = datetime.datetime(2024, 5, 1, 12, 30, tzinfo=datetime.timezone.utc)
    entry = make(args=[when, Decimal("1.10"), uuid.UUID(int=7)])
    assert decode(encode(entry, "json")).args == [when, Decimal("1.10"), uuid.UUID(int=7)]


def test_pickle_is_read_only_by_a_store_that_writes_pickle() -> None:
    entry = make(args=[("a", "tuple"), {1, 2}])
    data = encode(entry, "pickle")
    with pytest.raises(UndecodableEntry, match="not one this store reads"):
        decode(data)
    with pytest.raises(UndecodableEntry, match="not one this store reads"):
        decode(data, ["json", "msgpack"])
    assert decode(data, ["pickle"]).args == [("a", "tuple"), {1, 2}]


def test_msgpack_round_trip_and_a_json_store_reads_msgpack() -> None:  # msgpack: test extra
    entry = make()
    assert decode(encode(entry, "msgpack")) == entry


def test_serializers_outside_the_allow_list_are_never_read() -> None:
    yaml_entry = b"1;application/x-yaml;utf-8\nid: x\n"
    with pytest.raises(UndecodableEntry, match="not one this store reads"):
        decode(yaml_entry, ["json", "pickle"])
    with pytest.raises(UndecodableEntry, match="not one this store reads"):
        decode(b"2;yaml;-\nid: x\n", ["json", "pickle"])


def test_a_store_reads_json_msgpack_and_only_its_own_pickle() -> None:
    assert readable("json") == readable("msgpack") == {"json", "msgpack"}
    assert readable("pickle") == {"json", "msgpack", "pickle"}
    with pytest.raises(ConfigurationError, match="resilience_serializer"):
        readable("yaml")


def test_undecodable_placeholder() -> None:
    placeholder = undecodable("abc", UndecodableEntry("bad bytes"), breaker="b", parked_at=5.0)
    assert placeholder.task_name == UNDECODABLE_TASK
    assert (placeholder.status, placeholder.dead_reason) == ("dead", "undecodable")
    assert "bad bytes" in placeholder.exc_message
    assert (placeholder.id, placeholder.breaker, placeholder.parked_at) == ("abc", "b", 5.0)


# -- garbage --------------------------------------------------------------------------------

JSON_HEADER = b"1;application/json;utf-8\n"
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_bytes_are_undecodable(data: bytes) -> None:
    with pytest.raises(UndecodableEntry):
        decode(data, ["json", "pickle", "yaml"])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_json_bodies_are_undecodable(body: bytes) -> None:
    with pytest.raises(UndecodableEntry):
        decode(JSON_HEADER + body)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(list(make().__dataclass_fields__)), json_values))
def test_any_field_values_decode_or_are_undecodable(fields: dict[str, Any]) -> None:
    body = {**vars(make()), **fields}
    try:
        data = JSON_HEADER + json.dumps(body).encode()
    except (TypeError, ValueError):
        return
    with contextlib.suppress(UndecodableEntry):
        decode(data)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "header"),
        (b"no header at all", "header"),
        (b"\xff\xfe;x;y\n{}", "header"),
        (b"3;json;-\n{}", "version"),
        (b"2;application/json;utf-8\n{}", "not one this store reads"),
        (b"1;application/json;utf-8", "version"),
        (b"1;application/x-unknown;binary\n{}", "not one this store reads"),
        (JSON_HEADER + b"[1, 2]", "not a mapping"),
        (JSON_HEADER + b'{"id": "x"}', "missing fields"),
        (b"1;application/x-python-serialize;binary\n" + pickle.dumps([1]), "not a mapping"),
        (b"1;application/x-python-serialize;binary\nnot a pickle", "can't be decoded"),
    ],
)
def test_malformed_entries_are_undecodable(data: bytes, match: str) -> None:
    with pytest.raises(UndecodableEntry, match=match):
        decode(data, ["json", "pickle"])


@pytest.mark.parametrize(
    "changes",
    [
        {"retries": "3"},
        {"retries": -1},
        {"replays": True},
        {"args": {"a": 1}},
        {"kwargs": [1]},
        {"options": None},
        {"breaker": 5},
        {"reason": "bored"},
        {"status": "PARKED"},
        {"parked_at": "yesterday"},
        {"due_at": None},
        {"id": ""},
        {"task_name": None},
        {"dead_reason": 1},
    ],
)
def test_wrong_types_are_undecodable(changes: dict[str, Any]) -> None:
    body = {**vars(make()), **changes}
    with pytest.raises(UndecodableEntry):
        decode(JSON_HEADER + json.dumps(body).encode())


def test_huge_numbers_are_undecodable() -> None:
    body = encode(make(), "json").replace(b"1700000030.5", b"1" + b"0" * 400)
    with pytest.raises(UndecodableEntry):
        decode(body)


def test_unknown_fields_are_ignored_and_dead_reason_is_optional() -> None:
    entry = make()
    body = {**vars(entry), "added_later": 1}
    del body["dead_reason"]
    assert decode(JSON_HEADER + json.dumps(body).encode()) == entry


# -- traceback cutting ----------------------------------------------------------------------


def test_short_traceback_is_kept() -> None:
    assert cut_traceback("abc") == "abc"
    assert cut_traceback("x" * 8192) == "x" * 8192


def test_long_traceback_keeps_the_innermost_frames() -> None:
    frames = "".join(f'  File "m.py", line {i}, in f{i}\n    call()\n' for i in range(1000))
    text = "Traceback (most recent call last):\n" + frames + "ValueError: boom\n"
    cut = cut_traceback(text)
    assert len(cut) <= 8192
    assert cut.endswith("line 999, in f999\n    call()\nValueError: boom\n")
    first, rest = cut.split("\n", 1)
    assert re.fullmatch(r"\[\.\.\. \d+ characters cut \.\.\.\]", first)
    assert int(first.split()[1]) == len(text) - len(rest)
    assert rest.startswith("  ")  # starts on a whole line


@given(st.text(max_size=3000), st.integers(min_value=0, max_value=2000))
def test_cut_traceback_bounds(text: str, limit: int) -> None:
    cut = cut_traceback(text, limit)
    assert len(cut) <= max(limit, 0)
    if len(text) <= limit:
        assert cut == text
    else:
        marker, _, kept = cut.partition("\n")
        assert text.endswith(cut) or (marker.startswith("[... ") and text.endswith(kept))


# -- Lua script headers ---------------------------------------------------------------------


def test_lua_scripts_document_keys_argv_and_return() -> None:
    lua = resources.files("celery_resilience.backout.redis").joinpath("lua")
    # A prelude (``_common.lua``) is no script: helpers loaded before each script of the folder.
    scripts = [p for p in lua.iterdir() if p.name.endswith(".lua") and not p.name.startswith("_")]
    assert {p.name for p in scripts} >= {"park.lua", "delete.lua", "mark_dead.lua"}
    for script in scripts:
        lines = script.read_text().splitlines()
        end = next(i for i, line in enumerate(lines) if not line.startswith("--"))
        header = "\n".join(lines[:end])
        assert "KEYS[1]" in header, script.name
        assert "ARGV" in header, script.name
        assert "Returns" in header, script.name
