"""Example tools the built-in setup offers."""

from __future__ import annotations

import zlib
from typing import Literal

from gateway.tools import ToolError, ToolRegistry, tool

_CONDITIONS = ("clear skies", "light rain", "overcast", "fog", "a light breeze")


@tool(concurrent=True)
async def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict[str, object]:
    """Current weather for a city (made up, but the same city always gets the same weather).

    Args:
        city: the city name, e.g. "Paris"
        unit: temperature unit of the answer
    """
    if not city.strip():
        raise ToolError("city must not be empty; pass a city name such as 'Paris'")
    seed = zlib.crc32(city.strip().lower().encode())
    celsius = 5 + seed % 25
    temperature = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32, 1)
    return {"city": city, "temperature": temperature, "unit": unit, "conditions": _CONDITIONS[seed % 5]}


@tool
def to_fahrenheit(celsius: float) -> float:
    """Convert a temperature from degrees Celsius to degrees Fahrenheit.

    Args:
        celsius: the temperature in degrees Celsius
    """
    return round(celsius * 9 / 5 + 32, 1)


@tool(concurrent=True)
async def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: anything
    """
    return text


def demo_registry() -> ToolRegistry:
    return ToolRegistry([get_weather, to_fahrenheit, echo])
