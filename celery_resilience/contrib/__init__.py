"""Optional integrations: Django, pytest."""
