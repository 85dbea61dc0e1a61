"""Tables of the database back-out store (``store.py``), and the admin's configured-store page.

Times are float epoch seconds, as in the other stores: they round-trip exactly and the claim
query compares them as numbers. ``payload`` holds the bytes of ``backout.codec.Codec.encode``, so an
entry whose bytes can't be decoded behaves exactly as in the Redis and memory stores; the other
columns are what filters, claims and the admin need without decoding it.
"""

from __future__ import annotations

from django.db import models

from ...backout.entry import REASONS, STATUSES


class ParkedTaskRecord(models.Model):
    """One parked task. ``breaker`` is ``"-"`` for entries without one (the store convention)."""

    id = models.CharField("entry id", max_length=32, primary_key=True)
    task_name = models.CharField(max_length=255, db_index=True)  # the admin's task filter
    task_id = models.CharField(max_length=255, db_index=True)
    breaker = models.CharField(max_length=200, db_index=True)
    reason = models.CharField(max_length=32, choices=[(r, r.replace("_", " ")) for r in REASONS])
    status = models.CharField(max_length=16, choices=[(s, s) for s in STATUSES])
    dead_reason = models.CharField(max_length=200, blank=True, default="")
    parked_at = models.FloatField(db_index=True, help_text="epoch seconds")
    #: When a drain may replay it; while claimed, the end of the drain's lease.
    due_at = models.FloatField(db_index=True, help_text="epoch seconds")
    lease_until = models.FloatField(null=True, blank=True, help_text="epoch seconds")
    died_at = models.FloatField(null=True, blank=True, help_text="epoch seconds")
    payload = models.BinaryField()
    #: Why the last drain to judge it left it parked for a process that can read it (a key it
    #: lacked, a newer release's format); null otherwise (and in rows of older releases).
    held = models.CharField(max_length=32, null=True, blank=True)

    class Meta:
        verbose_name = "parked task record"
        verbose_name_plural = "parked task records (database store)"
        # The admin's filters, newest first: at a million rows a rare status or reason would
        # otherwise walk the parked_at index until a page of them turned up.
        indexes = (
            models.Index(fields=["status", "-parked_at"], name="resilience_status_parked"),
            models.Index(fields=["reason", "-parked_at"], name="resilience_reason_parked"),
            models.Index(
                fields=["held", "parked_at"],
                name="resilience_held",
                condition=models.Q(held__isnull=False),
            ),
        )
        #: Replay sends tasks to the workers again, discard (delete) removes them: two rights.
        permissions = (("replay_parkedtaskrecord", "Can replay parked task records"),)

    def __str__(self) -> str:
        return f"{self.task_name}[{self.task_id}] ({self.id})"


class ConsumedEntry(models.Model):
    """An entry a drain or a replay published, remembered until its signed lifetime ends: a
    copy of it written back into the table is refused (dead ``replayed``)."""

    id = models.CharField("entry id", max_length=32, primary_key=True)
    #: The consumed entry's signed park time: a later park of the same message is no copy.
    parked_at = models.FloatField(help_text="epoch seconds")
    until = models.FloatField(db_index=True, help_text="epoch seconds")

    class Meta:
        verbose_name = "consumed entry"

    def __str__(self) -> str:
        return str(self.id)


class ResilienceStat(models.Model):
    """A monotonic counter of ``stats``/``bump``; rows named ``lock|...`` are the store's locks."""

    name = models.CharField(max_length=255, primary_key=True)
    value = models.FloatField(default=0.0)

    class Meta:
        verbose_name = "resilience counter"

    def __str__(self) -> str:
        return f"{self.name} = {self.value:g}"


class StoreEntry(models.Model):
    """No table: gives the admin's page of the app's configured store a place and permissions.

    The page (``admin_store.py``) reads the store through ``Resilience.for_app(app).backout``,
    so it works for Redis, the database store or any other.
    """

    id = models.CharField("entry id", max_length=64, primary_key=True)

    class Meta:
        managed = False
        verbose_name = "parked task"
        verbose_name_plural = "parked tasks (configured store)"
        #: "Replay" needs this, "Discard" the delete permission: sending again is not removing.
        permissions = (("replay_storeentry", "Can replay parked tasks"),)


class Breaker(models.Model):
    """No table: gives the admin's page of the shared breakers a place and permissions.

    The page (``admin_breakers.py``) reads and steers them through
    ``Resilience.for_app(app).breaker(name)``: view to look, change to force or reset.
    """

    name = models.CharField(max_length=200, primary_key=True)

    class Meta:
        managed = False
        verbose_name = "breaker"
        verbose_name_plural = "breakers"


class Overview(models.Model):
    """No table: gives the admin's overview page (``admin_overview.py``) a place and its view
    permission."""

    id = models.CharField(max_length=1, primary_key=True)

    class Meta:
        managed = False
        verbose_name = "overview"
        verbose_name_plural = "overview"
