# An engine secret starting with "-" is read as a flag by an engine that turns its options
# file back into command-line words (SGLang's --config, where the agent puts its key): such a
# secret is made again. The deployment's engines restart with the new one, and the gateway
# sends it from its next sync.

from django.db import migrations

import inventory.models.deployments


def remake_dashed(apps, schema_editor):
    Deployment = apps.get_model("inventory", "Deployment")
    for deployment in Deployment.objects.filter(engine_secret__startswith="-"):
        deployment.engine_secret = inventory.models.deployments.new_engine_secret()
        deployment.save(update_fields=["engine_secret"])


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0011_deployment_max_in_flight_per_replica"),
    ]

    operations = [migrations.RunPython(remake_dashed, migrations.RunPython.noop)]
