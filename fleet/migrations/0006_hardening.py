# Issue #10 hardening: job idempotency keys; operators are staff; API tokens
# move from rest_framework.authtoken (plain text) to django-rest-knox (hashed).

import hashlib

from django.conf import settings
from django.db import migrations, models


def operators_are_staff(apps, schema_editor):
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    User.objects.filter(groups__name="operator").update(is_staff=True)


def hash_plain_tokens(apps, schema_editor):
    """Copy each rest_framework.authtoken key into a knox row (knox looks a token
    up by its first 15 characters and compares the SHA-512 of the whole key, so
    an old 40-character key keeps working as it is), then drop the plain-text
    table: nothing stored can be used as a token any more."""
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    AuthToken = apps.get_model("knox", "AuthToken")
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id, created FROM authtoken_token")
        rows = cursor.fetchall()
    for key, user_id, created in rows:
        digest = hashlib.sha512(key.encode()).hexdigest()
        token, _ = AuthToken.objects.get_or_create(
            digest=digest, defaults={"token_key": key[:15], "user_id": user_id, "expiry": None}
        )
        # auto_now_add set "created" to now; keep when the token was really issued.
        AuthToken.objects.filter(digest=digest).update(created=created)
    schema_editor.execute(schema_editor.sql_delete_table % {"table": schema_editor.quote_name("authtoken_token")})


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0005_decisions'),
        ('knox', '0009_extend_authtoken_field'),
        ('auth', '0012_alter_user_first_name_max_length'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='idempotency_key',
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='request_digest',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.UniqueConstraint(condition=models.Q(('idempotency_key__isnull', False)), fields=('tenant', 'idempotency_key'), name='job_idempotency_key_per_tenant'),
        ),
        migrations.RunPython(operators_are_staff, migrations.RunPython.noop),
        migrations.RunPython(hash_plain_tokens, migrations.RunPython.noop),
    ]
