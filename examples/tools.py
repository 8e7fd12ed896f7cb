"""Example tools for `tether run --tools-from examples/tools.py`."""

import asyncio

from tether import tool

FORECASTS = {"oslo": "3 °C, light snow", "lisbon": "17 °C, sunny"}


@tool
async def get_forecast(city: str) -> str:
    """Today's forecast for a city (a canned table, for the demo).

    Args:
        city: The city name, e.g. "Oslo".
    """
    await asyncio.sleep(0.2)
    return FORECASTS.get(city.lower(), "no forecast for that city")
