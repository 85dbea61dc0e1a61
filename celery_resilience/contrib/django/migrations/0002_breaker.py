from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("celery_resilience", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Breaker",
            fields=[
                ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "breaker",
                "verbose_name_plural": "breakers",
                "managed": False,
            },
        ),
    ]
