"""Replay gets a permission of its own (apart from discard, the delete permission); the task
filter gets an index; the overview page gets its table-less model (reversible).

Building the ``task_name`` index holds writes to the table back for as long as it takes
(seconds at a million rows): run it when the store is quiet.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("celery_resilience", "0003_filter_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="Overview",
            fields=[
                ("id", models.CharField(max_length=1, primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "overview",
                "verbose_name_plural": "overview",
                "managed": False,
            },
        ),
        migrations.AlterModelOptions(
            name="parkedtaskrecord",
            options={
                "permissions": (("replay_parkedtaskrecord", "Can replay parked task records"),),
                "verbose_name": "parked task record",
                "verbose_name_plural": "parked task records (database store)",
            },
        ),
        migrations.AlterModelOptions(
            name="storeentry",
            options={
                "managed": False,
                "permissions": (("replay_storeentry", "Can replay parked tasks"),),
                "verbose_name": "parked task",
                "verbose_name_plural": "parked tasks (configured store)",
            },
        ),
        migrations.AlterField(
            model_name="parkedtaskrecord",
            name="task_name",
            field=models.CharField(db_index=True, max_length=255),
        ),
    ]
