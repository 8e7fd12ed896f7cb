"""A browser for sign-ins under test: `BROWSER="python browser.py"` makes `webbrowser.open(URL)`
fetch URL and follow its redirects, as a person's browser does when the authorization server
approves at once (the conformance suite's and our test server's do). Only 127.0.0.1 is fetched.
"""

from __future__ import annotations

import sys
import urllib.request
from urllib.parse import urlsplit


def main(url: str) -> int:
    if urlsplit(url).hostname not in ("127.0.0.1", "localhost"):
        print(f"browser.py: not fetching {url}: tests stay on 127.0.0.1", file=sys.stderr)
        return 1
    with urllib.request.urlopen(url, timeout=30) as response:  # follows redirects
        response.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1]))
