"""The Celery apps that real ``celery worker``, ``beat`` and ``flower`` subprocesses load
(``celery -A tests.apps.<name> ...``)."""
