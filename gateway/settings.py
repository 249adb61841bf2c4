"""Settings: one pydantic-settings model. Nothing else in toolspan reads the environment."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOOLSPAN_", extra="ignore")

    tool_timeout_seconds: float = Field(30.0, gt=0, description="Default time limit of one tool call")
    record_tool_arguments: bool = Field(False, description="Put raw arguments on every tool.call span")
    argument_max_chars: int = Field(2048, ge=64, description="Raw arguments on spans are cut to this")
    redact_keys: tuple[str, ...] = Field(
        ("password", "secret", "token", "api_key", "apikey", "authorization", "credential", "private_key"),
        description="Argument values under keys containing any of these are masked on spans")
