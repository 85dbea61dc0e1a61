"""The entries a drain or a replay published, remembered until their signed lifetime ends, so
that a copy written back into the table is refused (a new table: older releases ignore it)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("celery_resilience", "0004_replay_permission_overview"),
    ]

    operations = [
        migrations.CreateModel(
            name="ConsumedEntry",
            fields=[
                (
                    "id",
                    models.CharField(
                        max_length=32, primary_key=True, serialize=False, verbose_name="entry id"
                    ),
                ),
                ("parked_at", models.FloatField(help_text="epoch seconds")),
                ("until", models.FloatField(db_index=True, help_text="epoch seconds")),
            ],
            options={
                "verbose_name": "consumed entry",
            },
        ),
    ]
