"""Fixtures of the chat page's browser tests: a real `mica serve` (the workspace's debug
binary, which `cargo test --workspace` builds) on the SmolLM2 test model, and headless
Chromium driven by Selenium (Debian's `chromium` and `chromium-driver`; `scripts/test-python`
installs them when missing). Every browser's console log is checked for errors when its test
ends, and each test leaves a screenshot in the artifacts folder (``MICA_TEST_ARTIFACTS``, else
a pytest temporary folder), whose path it prints."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

REPO = pathlib.Path(__file__).resolve().parents[2]
SMOL = "smollm2-135m-instruct-q4_1.gguf"
KEY = "page-test-key"


def models_dir() -> pathlib.Path:
    d = os.environ.get("MICA_TEST_MODELS")
    if not d:
        pytest.fail("set MICA_TEST_MODELS to the test models' directory (scripts/test does)")
    p = pathlib.Path(d)
    if not (p / SMOL).is_file():
        pytest.fail(f"{p / SMOL} is missing: run scripts/fetch-test-models")
    return p


@pytest.fixture(scope="session")
def mica_bin() -> pathlib.Path:
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = target / "debug" / "mica"
    if not path.is_file():
        subprocess.run(["cargo", "build", "--locked", "-p", "mica-cli", "--bin", "mica"],
                       cwd=REPO, check=True)
    if not path.is_file():
        pytest.fail(f"{path} was not built")
    return path


class Server:
    """A `mica serve` process serving the test model as `alpha` and `smol`."""

    def __init__(self, mica_bin: pathlib.Path, folder: pathlib.Path, key: str | None):
        for name in ("alpha", "smol"):
            link = folder / f"{name}.gguf"
            if not link.exists():
                link.symlink_to(models_dir() / SMOL)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = key
        args = [str(mica_bin), "serve", "--models-dir", str(folder), "--port", str(self.port),
                "--threads", "1", "--kv-mem", "64M", "--ctx-size", "2048"]
        if key:
            args += ["--api-key", key]
        self.log = open(folder / "serve.log", "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mica serve did not start ({self.proc.poll()}): "
                            f"{(folder / 'serve.log').read_text()}")
            time.sleep(0.1)

    def get_json(self, path: str):
        req = urllib.request.Request(self.url + path)
        if self.key:
            req.add_header("Authorization", f"Bearer {self.key}")
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory, mica_bin):
    srv = Server(mica_bin, tmp_path_factory.mktemp("models"), None)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory, mica_bin):
    srv = Server(mica_bin, tmp_path_factory.mktemp("models-keyed"), KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> pathlib.Path:
    d = os.environ.get("MICA_TEST_ARTIFACTS")
    path = pathlib.Path(d) if d else tmp_path_factory.mktemp("web-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def find_browser() -> tuple[str, str]:
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
        pytest.fail("chromium and chromedriver are needed (Debian: apt-get install chromium "
                    "chromium-driver; scripts/test-python installs them)")
    return chrome, driver


class Browser:
    """A headless Chromium with its own profile, download folder and console log."""

    def __init__(self, downloads: pathlib.Path, width: int = 1280, height: int = 900):
        chrome, driver = find_browser()
        opts = webdriver.ChromeOptions()
        opts.binary_location = chrome
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--disable-gpu", "--no-first-run", "--disable-extensions",
                    f"--window-size={width},{height}"):
            opts.add_argument(arg)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        opts.add_experimental_option("prefs", {
            "download.default_directory": str(downloads),
            "download.prompt_for_download": False,
        })
        self.downloads = downloads
        self.driver = webdriver.Chrome(options=opts, service=Service(executable_path=driver))
        self.driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                                    {"behavior": "allow", "downloadPath": str(downloads)})
        self.console: list[dict] = []

    def logs(self) -> list[dict]:
        """The console entries so far (each read once from the driver, kept here)."""
        self.console += self.driver.get_log("browser")
        return self.console

    def errors(self, allowed=()) -> list[str]:
        """Console errors, but those whose message contains one of `allowed`."""
        return [e["message"] for e in self.logs()
                if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed)]

    def screenshot(self, artifacts: pathlib.Path, name: str) -> pathlib.Path:
        path = artifacts / f"{name}.png"
        self.driver.save_screenshot(str(path))
        print(f"screenshot: {path}")
        SCREENSHOTS.append(path)
        return path


SCREENSHOTS: list[pathlib.Path] = []


def pytest_terminal_summary(terminalreporter):
    """Names the screenshots at the end of the run, whether the tests passed or not."""
    if SCREENSHOTS:
        terminalreporter.write_line(f"tests/web screenshots ({len(SCREENSHOTS)}): "
                                    f"{SCREENSHOTS[0].parent}")


@pytest.fixture
def browser(tmp_path, artifacts, request):
    """A fresh browser (empty local storage). When the test ends, a screenshot is saved and
    the console must hold no error (a test that expects some says so with
    ``browser.allowed_errors``)."""
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    b = Browser(downloads)
    b.allowed_errors = ()
    try:
        yield b
        b.screenshot(artifacts, request.node.name)
        errors = b.errors(b.allowed_errors)
        assert not errors, f"console errors: {errors}"
    finally:
        b.driver.quit()
