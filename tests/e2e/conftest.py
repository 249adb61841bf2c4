"""Fixtures of the black-box tests beyond tests/conftest.py's."""

from tests.e2e.otlp import receiver
from tests.e2e.phoenix import phoenix

__all__ = ["phoenix", "receiver"]  # Arize Phoenix; a real OTLP/HTTP endpoint (spans and log records)
