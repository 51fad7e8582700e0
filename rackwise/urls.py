from django.contrib import admin
from django.contrib.auth.decorators import login_not_required
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from fleet.auth import AdminLoginForm
from fleet.prometheus import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("fleet.api.urls")),
    path("metrics", metrics_view, name="metrics"),
    # Browsers ask for /favicon.ico on pages that name no icon (the admin, the API docs).
    path(
        "favicon.ico",
        login_not_required(RedirectView.as_view(url=static("rackwise/favicon.svg"), permanent=True)),
    ),
    path("", include("fleet.urls")),
]

# Under /api/ a path that matches no route answers JSON like every other API error
# (clients parse it); elsewhere Django's own page.
handler404 = "fleet.api.errors.not_found"

# A database error outside the API's own handler is a 503 with Retry-After, not a 500.
handler500 = "fleet.api.errors.server_error"

# The admin's login counts failed passwords like the console's (fleet.auth).
admin.site.login_form = AdminLoginForm
