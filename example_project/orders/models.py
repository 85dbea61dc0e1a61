from django.db import models


class Order(models.Model):
    """An order to charge. ``status`` is the shop's view; the gateway's ledger is the truth."""

    class Status(models.TextChoices):
        PENDING = "pending"  # submitted, not charged yet (perhaps retrying)
        CHARGED = "charged"
        PARKED = "parked"  # in the back-out store: replayed once the gateway is back
        FAILED = "failed"  # a non-transient error (card declined, a bug): a person looks

    amount = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.PENDING, db_index=True
    )
    charge_count = models.PositiveIntegerField(default=0)  # > 1 would be a double charge
    attempts = models.PositiveIntegerField(default=0)  # calls made to the gateway
    charge_id = models.CharField(max_length=64, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"Order {self.pk} ({self.amount}, {self.status})"
