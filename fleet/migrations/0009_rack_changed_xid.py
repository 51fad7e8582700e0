from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0008_sample_waits'),
    ]

    operations = [
        migrations.AddField(
            model_name='rack',
            name='changed_xid',
            field=models.PositiveBigIntegerField(db_index=True, default=0),
        ),
    ]
