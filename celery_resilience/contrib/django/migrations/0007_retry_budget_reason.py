"""Reason ``retry_budget``: a retry over its breaker's retry budget, parked."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("celery_resilience", "0006_held_entries"),
    ]

    operations = [
        migrations.AlterField(
            model_name="parkedtaskrecord",
            name="reason",
            field=models.CharField(
                choices=[
                    ("breaker_open", "breaker open"),
                    ("retries_exhausted", "retries exhausted"),
                    ("park_on", "park on"),
                    ("delay_too_long", "delay too long"),
                    ("redelivered", "redelivered"),
                    ("retry_budget", "retry budget"),
                ],
                max_length=32,
            ),
        ),
    ]
