"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``, installed by
scripts/install-browser.sh) driven by selenium. Where it is missing the browser tests are
skipped with the reason, except in CI (``CI`` set): there they fail, so a runner without a
browser cannot pass with them quietly skipped. Screenshots go to ``screenshots/`` at the
repository root (git ignores it)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console.required import missing

try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement
    from selenium.webdriver.support.wait import WebDriverWait
except ImportError:
    missing("selenium is not installed (the dev extra has it)", module=True)

__all__ = [
    "PHONE",
    "By",
    "WebDriver",
    "WebElement",
    "binaries",
    "browser_fixture",
    "flash",
    "overflow",
    "press",
    "screenshot",
    "sign_in",
]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "screenshots"
LAPTOP = (1280, 900)
PHONE = (390, 844)
MAX_SHOT_HEIGHT = 6000


def binaries() -> tuple[str, str]:
    """The chromium and chromedriver to drive (skipped, or failed in CI, without them)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        missing(
            "headless chromium is not installed (Debian's chromium and chromium-driver): "
            "run scripts/install-browser.sh as root"
        )
    return chromium, driver


@pytest.fixture(name="browser")
def browser_fixture() -> Iterator[WebDriver]:
    """A headless Chromium at laptop size (no Selenium Manager: Debian's binaries only)."""
    chromium, driver_path = binaries()
    options = Options()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={LAPTOP[0]},{LAPTOP[1]}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def sign_in(driver: WebDriver, url: str, token: str) -> None:
    """Sign in through the form, as a person would."""
    driver.get(f"{url}/signin")
    driver.find_element(By.ID, "token").send_keys(token)
    press(driver, driver.find_element(By.ID, "signin"))


def press(driver: WebDriver, button: WebElement) -> None:
    """Click a form's button and wait for the page it leads to (a bare click returns before
    the browser has left the old page, whose elements a test would then read)."""
    page = driver.find_element(By.TAG_NAME, "html")
    button.click()
    WebDriverWait(driver, 15).until(lambda _: _left(page))


def _left(page: WebElement) -> bool:
    """Whether the browser has left the page ``page`` belonged to. Selenium's staleness_of
    expects a stale-element error; a newer chromedriver asked about an element of the page it is
    leaving may instead answer "Node with given id does not belong to the document" (an
    "unknown error"), which means the same thing."""
    try:
        page.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc.msg):
            return True
        raise
    return False


def flash(driver: WebDriver) -> str:
    """The outcome line the last action left on the page."""
    return str(driver.find_element(By.ID, "flash").text)


def screenshot(driver: WebDriver, name: str, size: tuple[int, int] | None = LAPTOP) -> Path:
    """Save the whole page (not only what the window shows) as ``screenshots/NAME.png``, at
    ``size``'s width (the window is put back to a laptop's after), or at the window's width
    now with None."""
    SCREENSHOTS.mkdir(exist_ok=True)
    before = driver.get_window_size()
    width = size[0] if size is not None else before["width"]
    driver.set_window_size(width, size[1] if size is not None else before["height"])
    # The window's height includes its frame; the page needs its own height inside it.
    tall, frame = driver.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]"
    )
    driver.set_window_size(width, min(int(tall) + int(frame), MAX_SHOT_HEIGHT))
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(*(LAPTOP if size is not None else (before["width"], before["height"])))
    return path


def overflow(driver: WebDriver) -> int:
    """How many CSS pixels the page is wider than the window (0: nothing to scroll sideways)."""
    return int(
        driver.execute_script(
            "return Math.max(0, document.documentElement.scrollWidth - window.innerWidth)"
        )
    )
