from django.contrib import admin
from django.urls import include, path

from fleet.prometheus import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("fleet.api.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("", include("fleet.urls")),
]
