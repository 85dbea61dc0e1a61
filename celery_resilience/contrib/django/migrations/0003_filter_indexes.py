"""Indexes for the admin's status and reason filters, newest first (reversible: RemoveIndex).

Building them holds writes to the table back for as long as it takes (seconds at a million
rows): run it when the store is quiet.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("celery_resilience", "0002_breaker"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="parkedtaskrecord",
            index=models.Index(fields=["status", "-parked_at"], name="resilience_status_parked"),
        ),
        migrations.AddIndex(
            model_name="parkedtaskrecord",
            index=models.Index(fields=["reason", "-parked_at"], name="resilience_reason_parked"),
        ),
    ]
