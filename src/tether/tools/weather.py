"""`get_weather`: an HTTP tool against a configurable weather service.

The service URL comes from the run's config (`weather_url`), else `TETHER_WEATHER_URL`, else
wttr.in. `{city}` in the URL is replaced by the city; without it, `?city=` is added.
"""

from __future__ import annotations

import os
import urllib.parse

from .tool import RunContext, tool

DEFAULT_URL = "https://wttr.in/{city}?format=j1"


def weather_url(ctx: RunContext, city: str) -> str:
    base = str(ctx.config.get("weather_url") or os.environ.get("TETHER_WEATHER_URL") or DEFAULT_URL)
    quoted = urllib.parse.quote(city)
    if "{city}" in base:
        return base.replace("{city}", quoted)
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}city={quoted}"


@tool(timeout=20, idempotent=True)
async def get_weather(city: str, ctx: RunContext) -> str:
    """Current weather for a city, from the configured weather service.

    Args:
        city: The city name, e.g. "Oslo".
    """
    import aiohttp  # here: importing it costs 0.2 s, and most runs never call this tool

    timeout = aiohttp.ClientTimeout(total=15)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(weather_url(ctx, city)) as resp,
    ):
        body = await resp.text()
        if resp.status >= 400:
            raise RuntimeError(f"weather service answered HTTP {resp.status}: {body[:200]}")
        return body[:4000]
