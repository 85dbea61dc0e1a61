"""What the tests share: real servers, faults, worker processes and the docs build."""
