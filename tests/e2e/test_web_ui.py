"""The web page at / in a real browser: Debian's headless Chromium driven by
Selenium (through Debian's chromedriver; nothing is downloaded). A chat
round trip streams into the page, a schema-constrained reply renders as JSON,
the metrics plots draw with data, a wrong API key shows an error.
Screenshots go to build/test-artifacts/web-ui (PAGELLM_ARTIFACTS overrides)."""

import json
import os
import shutil
from pathlib import Path

import pytest
import requests

from conftest import REPO, STORIES, Server, default_model_path

selenium = pytest.importorskip("selenium")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

ARTIFACTS = Path(os.environ.get("PAGELLM_ARTIFACTS", REPO / "build" / "test-artifacts")) / "web-ui"
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
KEY = "sk-web-ui-test"


# The default model (Gemma 3 270M): what a user of `make serve` sees, slow
# enough on 2 cores that Stop has a stream to stop.
@pytest.fixture(scope="module")
def server():
    model = default_model_path()
    if model is None:
        pytest.skip("the default model is installed by tools/setup.sh")
    s = Server(["--api-key", KEY, "--max-model-len", "2048"], model=model).start()
    s.name = requests.get(s.url("/v1/models"), headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]["id"]
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM or not Path(CHROMEDRIVER).exists():
        pytest.skip("Chromium and chromedriver are installed by tools/setup.sh")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--force-prefers-reduced-motion"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    driver.set_script_timeout(30)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def wait(driver, condition, timeout=60):
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition(d))


def set_key(driver, key):
    driver.find_element(By.ID, "key-button").click()
    field = driver.find_element(By.ID, "key-input")
    field.clear()
    field.send_keys(key)
    driver.find_element(By.ID, "key-save").click()


def fill(driver, element_id, text):
    field = driver.find_element(By.ID, element_id)
    field.clear()
    if text:
        # Typing a long JSON schema key by key is slow; set it, then fire input.
        driver.execute_script("arguments[0].value = arguments[1];", field, text)


def last_assistant(driver):
    found = driver.find_elements(By.CSS_SELECTOR, "#messages li.msg.assistant")
    return found[-1] if found else None


def send_chat(driver, text):
    before = len(driver.find_elements(By.CSS_SELECTOR, "#messages li.msg.assistant"))
    box = driver.find_element(By.ID, "chat-input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)  # Enter sends
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#messages li.msg.assistant")) > before)
    msg = last_assistant(driver)
    wait(driver, lambda d: msg.get_attribute("data-done") == "true" or "error" in msg.get_attribute("class"))
    return msg


def test_page_and_assets_are_served_from_the_binary(server):
    page = requests.get(server.url("/"))
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css"), ("favicon.svg", "image/svg+xml")):
        r = requests.get(server.url(f"/ui/{name}"))
        assert r.status_code == 200 and r.headers["Content-Type"].startswith(kind), name
        again = requests.get(server.url(f"/ui/{name}"), headers={"If-None-Match": r.headers["ETag"]})
        assert again.status_code == 304
    missing = requests.get(server.url("/ui/nothing.js"))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    # The page itself needs no key; the API behind it does.
    assert requests.get(server.url("/v1/models")).status_code == 401


def test_wrong_api_key_shows_an_error(server, browser):
    browser.get(server.url("/"))
    browser.execute_script("localStorage.clear()")
    browser.get(server.url("/"))
    set_key(browser, "not-the-key")
    banner = browser.find_element(By.ID, "error")
    wait(browser, lambda d: banner.is_displayed() and "401" in banner.text)
    assert "API key" in banner.text
    assert browser.find_element(By.ID, "server-status").text == "API key needed"
    # A chat request with the wrong key: the reply slot shows the error, nothing hangs.
    browser.execute_script("document.getElementById('error').hidden = true")
    msg = send_chat(browser, "Hello")
    assert "error" in msg.get_attribute("class") and "401" in msg.text
    wait(browser, lambda d: banner.is_displayed() and "401" in banner.text)
    assert browser.find_element(By.ID, "chat-send").is_enabled()
    browser.save_screenshot(str(ARTIFACTS / "wrong-key.png"))


def test_chat_streams_tokens_into_the_page(server, browser):
    browser.get(server.url("/"))
    set_key(browser, KEY)
    wait(browser, lambda d: d.find_element(By.ID, "server-status").text == server.name)
    assert not browser.find_element(By.ID, "error").is_displayed()
    fill(browser, "temperature", "0")
    fill(browser, "max-tokens", "40")
    msg = send_chat(browser, "Write one sentence about the sea.")
    assert "error" not in msg.get_attribute("class")
    text = msg.find_element(By.CSS_SELECTOR, ".content").text
    assert text.strip()
    # Many SSE chunks arrived and were appended one by one.
    assert int(msg.get_attribute("data-chunks")) > 5
    meta = msg.find_element(By.CSS_SELECTOR, ".meta").text
    assert "tok/s" in meta and ("finish: length" in meta or "finish: stop" in meta)
    # The same greedy request over the API gives the same text.
    direct = requests.post(server.url("/v1/chat/completions"), headers={"Authorization": f"Bearer {KEY}"},
                           json={"messages": [{"role": "user", "content": "Write one sentence about the sea."}],
                                 "temperature": 0, "top_p": 0.95, "max_tokens": 40}).json()
    assert direct["choices"][0]["message"]["content"].strip() == text.strip()
    browser.save_screenshot(str(ARTIFACTS / "chat.png"))


def test_schema_constrained_reply_renders_as_json(server, browser):
    browser.find_element(By.ID, "chat-clear").click()
    browser.find_element(By.CSS_SELECTOR, "#schema-box summary").click()
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    fill(browser, "json-schema", json.dumps(schema))
    fill(browser, "max-tokens", "60")
    msg = send_chat(browser, "Is the sky blue?")
    pre = msg.find_element(By.CSS_SELECTOR, "pre.json")
    value = json.loads(pre.text)
    assert value["answer"] in ("yes", "no")
    assert "valid JSON" in msg.find_element(By.CSS_SELECTOR, ".badge").text
    browser.save_screenshot(str(ARTIFACTS / "structured.png"))
    fill(browser, "json-schema", "")


def test_tool_definitions_give_a_tool_call(server, browser):
    browser.find_element(By.ID, "chat-clear").click()
    browser.find_element(By.CSS_SELECTOR, "#tools-box summary").click()
    weather = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    fill(browser, "tools", json.dumps(weather))
    Select(browser.find_element(By.ID, "tool-choice")).select_by_visible_text("required")
    browser.find_element(By.ID, "parallel-tools").click()  # one call (the README's example)
    msg = send_chat(browser, "What is the weather in Paris?")
    call = msg.find_element(By.CSS_SELECTOR, "pre.tool-call").text
    name, _, args = call.partition("(")
    assert name == "get_weather" and json.loads(args.rstrip(")")) == {"city": "Paris"}, call
    assert "finish: tool_calls" in msg.find_element(By.CSS_SELECTOR, ".meta").text
    browser.save_screenshot(str(ARTIFACTS / "tools.png"))
    fill(browser, "tools", "")
    browser.find_element(By.ID, "chat-clear").click()


def test_bad_json_in_a_settings_box_is_an_error_not_a_request(server, browser):
    fill(browser, "json-schema", "{not json")
    before = len(browser.find_elements(By.CSS_SELECTOR, "#messages li.msg"))
    box = browser.find_element(By.ID, "chat-input")
    box.send_keys("Hello")
    box.send_keys(Keys.ENTER)
    banner = browser.find_element(By.ID, "error")
    wait(browser, lambda d: banner.is_displayed() and "JSON schema is not valid JSON" in banner.text)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#messages li.msg")) == before
    fill(browser, "json-schema", "")
    box.clear()


def test_stop_ends_a_stream(server, browser):
    fill(browser, "max-tokens", "1000")
    box = browser.find_element(By.ID, "chat-input")
    box.send_keys("Tell me a long story about a lighthouse keeper.")
    box.send_keys(Keys.ENTER)
    stop = browser.find_element(By.ID, "chat-stop")
    wait(browser, lambda d: stop.is_enabled())
    msg = last_assistant(browser)
    wait(browser, lambda d: int(msg.get_attribute("data-chunks") or 0) >= 3)  # streaming now
    stop.click()
    wait(browser, lambda d: msg.get_attribute("data-done") == "true")
    assert "finish: stopped" in msg.find_element(By.CSS_SELECTOR, ".meta").text
    assert browser.find_element(By.ID, "chat-send").is_enabled()
    # Esc stops too.
    box.send_keys("Tell me another long story.")
    box.send_keys(Keys.ENTER)
    wait(browser, lambda d: last_assistant(d) is not msg)
    other = last_assistant(browser)
    wait(browser, lambda d: int(other.get_attribute("data-chunks") or 0) >= 3)
    box.send_keys(Keys.ESCAPE)
    wait(browser, lambda d: other.get_attribute("data-done") == "true")
    assert "finish: stopped" in other.find_element(By.CSS_SELECTOR, ".meta").text


def test_completion_mode_streams(server, browser):
    browser.find_element(By.ID, "tab-completion").click()
    fill(browser, "max-tokens", "30")
    fill(browser, "completion-prompt", "The three primary colors are")
    browser.find_element(By.ID, "completion-send").click()
    out = browser.find_element(By.ID, "completion-output")
    wait(browser, lambda d: "finish:" in d.find_element(By.ID, "completion-stats").text)
    assert int(out.get_attribute("data-chunks")) > 5
    assert out.find_element(By.CSS_SELECTOR, ".generated").text.strip()


def test_models_view_lists_the_served_model(server, browser):
    browser.find_element(By.ID, "tab-models").click()
    wait(browser, lambda d: server.name in d.find_element(By.ID, "models-body").text)
    assert browser.find_element(By.CSS_SELECTOR, "aside.settings").is_displayed() is False


def test_dashboard_plots_draw_with_data(server, browser):
    browser.get(server.url("/?poll=300#dashboard"))
    # Traffic while the page watches, so the rates have something to show.
    for _ in range(3):
        requests.post(server.url("/v1/completions"), headers={"Authorization": f"Bearer {KEY}"},
                      json={"prompt": "The capital of France is", "max_tokens": 20, "temperature": 0}).raise_for_status()
    for plot in ("plot-requests", "plot-kv", "plot-tokens", "plot-latency"):
        canvas = browser.find_element(By.ID, plot)
        wait(browser, lambda d: int(canvas.get_attribute("data-points") or 0) >= 2)
    tokens = browser.find_element(By.ID, "plot-tokens")
    # Pixels were drawn: count non-transparent ones in the canvas.
    drawn = browser.execute_script(
        "const c = arguments[0]; const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) ++n; return n;", tokens)
    assert drawn > 500
    wait(browser, lambda d: d.find_element(By.ID, "g-ttft").text.endswith("ms"))
    browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))


def test_narrow_screen_layout(server, browser):
    browser.set_window_size(420, 900)
    browser.get(server.url("/#chat"))
    settings = browser.find_element(By.CSS_SELECTOR, "aside.settings")
    chat = browser.find_element(By.ID, "view-chat")
    # One column on a phone: the settings go below the chat.
    assert settings.location["y"] > chat.location["y"]
    browser.save_screenshot(str(ARTIFACTS / "phone.png"))
    browser.set_window_size(1280, 900)


def test_no_webui_flag():
    s = Server(["--no-webui"], model=STORIES).start()
    try:
        assert requests.get(s.url("/")).status_code == 404
    finally:
        s.stop()
