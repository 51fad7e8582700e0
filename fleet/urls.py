from django.contrib.auth import views as auth_views
from django.urls import path

from fleet import views
from fleet.auth import LoginForm

urlpatterns = [
    path("", views.FleetView.as_view(), name="home"),
    path("racks/<int:pk>/", views.RackView.as_view(), name="rack"),
    path("racks/<int:pk>/signals/", views.RackSignalsFragmentView.as_view(), name="rack-signals"),
    path("jobs/", views.JobListView.as_view(), name="jobs"),
    path("jobs/submit/", views.JobSubmitView.as_view(), name="job-submit"),
    path("jobs/<int:pk>/", views.JobDetailView.as_view(), name="job"),
    path("actions/", views.ActionListView.as_view(), name="actions"),
    path("actions/<int:pk>/fragment/", views.ActionFragmentView.as_view(), name="action-fragment"),
    path("audit/", views.AuditView.as_view(), name="audit"),
    path("tenants/", views.TenantsView.as_view(), name="tenants"),
    path("webhooks/", views.WebhooksView.as_view(), name="webhooks"),
    path("login/", auth_views.LoginView.as_view(authentication_form=LoginForm), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
