"""The example project of celery-resilience: a small Django shop whose payment gateway goes down.

This directory is a Django project root (``manage.py``, ``shop``, ``orders``); being a package
too lets ``python -m example_project.demo`` run the one-command demo from the repository root.
"""
