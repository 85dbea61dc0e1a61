from django.contrib import admin

from .models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "amount", "status", "charge_count", "attempts", "charge_id", "updated")
    list_filter = ("status",)
    search_fields = ("id", "charge_id")
