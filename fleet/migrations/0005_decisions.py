from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0004_webhooks'),
    ]

    operations = [
        migrations.AddField(
            model_name='action',
            name='checked_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
