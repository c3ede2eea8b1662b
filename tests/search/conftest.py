"""The session's Ray (`ray_address`) lives in tests/conftest.py, shared with tests/report."""
