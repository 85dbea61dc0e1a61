"""Why the last drain to judge an entry left it parked for a process that can read it (a key
it lacked, a newer release's format). Nullable, so that rows an older release inserts (it
names no such column) are valid: null, not held."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("celery_resilience", "0005_consumed_entry"),
    ]

    operations = [
        migrations.AddField(
            model_name="parkedtaskrecord",
            name="held",
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
        migrations.AddIndex(
            model_name="parkedtaskrecord",
            index=models.Index(
                condition=models.Q(("held__isnull", False)),
                fields=["held", "parked_at"],
                name="resilience_held",
            ),
        ),
    ]
