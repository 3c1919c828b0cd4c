# The served model name clients send as `model` through the gateway. Existing deployments
# are served under their own name, which is unique and already in the name's alphabet.
# Each deployment also gets its own engine secret (a secret per row, not one default for all).

import secrets

import django.core.validators

import inventory.models.deployments
from django.db import migrations, models


def name_existing(apps, schema_editor):
    Deployment = apps.get_model("inventory", "Deployment")
    Deployment.objects.filter(served_model_name="").update(served_model_name=models.F("name"))
    for deployment in Deployment.objects.all():
        deployment.engine_secret = secrets.token_urlsafe(32)
        deployment.save(update_fields=["engine_secret"])


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0008_deployment_secret_arguments"),
    ]

    operations = [
        migrations.AddField(
            model_name="deployment",
            name="served_model_name",
            field=models.CharField(blank=True, default="", max_length=128),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="deployment",
            name="engine_secret",
            field=models.CharField(default="", editable=False, max_length=64),
            preserve_default=False,
        ),
        migrations.RunPython(name_existing, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="deployment",
            name="served_model_name",
            field=models.CharField(
                blank=True,
                help_text="What clients send as `model` through the gateway; empty takes the deployment's name.",
                max_length=128,
                unique=True,
                validators=[
                    django.core.validators.RegexValidator(
                        "^[A-Za-z0-9][A-Za-z0-9._:-]*\\Z",
                        "letters, digits, '.', '_', ':' and '-', starting with a letter or digit (not a path)",
                    )
                ],
                verbose_name="served model name",
            ),
        ),
        migrations.AlterField(
            model_name="deployment",
            name="engine_secret",
            field=models.CharField(
                default=inventory.models.deployments.new_engine_secret, editable=False, max_length=64
            ),
        ),
    ]
