import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0010_deployment_prefix_affinity"),
    ]

    operations = [
        migrations.AddField(
            model_name="deployment",
            name="max_in_flight_per_replica",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Requests each gateway sends one replica at once (its slots, say); beyond it the gateway queues them and serves tenants under their fair share first (docs/gateway.md). Empty: no limit.",
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(100000),
                ],
                verbose_name="max in flight per replica",
            ),
        ),
    ]
