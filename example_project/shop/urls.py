"""The admin only: orders, task results (django-celery-results) and, with the contrib app,
parked tasks."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
