"""Pages opened in a real headless browser (the system's Chromium, driven by selenium through
the system's chromedriver): JavaScript errors, drawn views and screenshots.

``.ci/run`` installs Debian's chromium and chromium-driver; elsewhere the tests that need them
skip, saying which is missing.
"""

from __future__ import annotations

import io
import os
import shutil
from contextlib import contextmanager

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def _find(names) -> str | None:
    return next((path for path in map(shutil.which, names) if path), None)


def browser_or_skip():
    """(chromium, chromedriver) paths, or skip the test saying what is missing."""
    pytest.importorskip("selenium", reason="selenium is in the test extra")
    chromium = os.environ.get("POLYC_CHROMIUM") or _find(CHROMIUM_NAMES)
    driver = os.environ.get("POLYC_CHROMEDRIVER") or _find(("chromedriver",))
    if not chromium or not driver:
        missing = " and ".join(n for n, p in (("chromium", chromium), ("chromedriver", driver)) if not p)
        pytest.skip(f"no {missing} on PATH (Debian: apt-get install chromium chromium-driver)")
    return chromium, driver


@contextmanager
def headless_browser(width: int = 1200, height: int = 900):
    """A headless Chromium that keeps the page's console messages."""
    chromium, driver_path = browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def javascript_errors(driver) -> list[str]:
    """The console's errors since the last call (uncaught exceptions are SEVERE)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def inked_fraction(png: bytes, background_tolerance: int = 12) -> float:
    """The fraction of a screenshot's pixels that differ from its most common colour."""
    import numpy as np
    from matplotlib import image

    pixels = image.imread(io.BytesIO(png), format="png")[..., :3]
    pixels = (pixels * 255).astype(np.int16).reshape(-1, 3)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    background = colours[counts.argmax()]
    return float((np.abs(pixels - background).max(axis=1) > background_tolerance).mean())
