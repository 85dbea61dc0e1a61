"""The checkout page (the web tier on the ``payments`` breaker) and the admin: orders, task
results (django-celery-results) and, with the contrib app, parked tasks."""

from django.contrib import admin
from django.urls import path

from orders.views import checkout

urlpatterns = [
    path("checkout/", checkout, name="checkout"),
    path("admin/", admin.site.urls),
]
