"""Fixtures of the black-box tests beyond tests/conftest.py's."""

from tests.e2e.otlp import receiver

__all__ = ["receiver"]  # a real OTLP/HTTP endpoint (spans and log records)
