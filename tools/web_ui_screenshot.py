#!/usr/bin/env python3
"""Takes the README's screenshots of the web page (docs/img/web-ui.png, the chat;
docs/img/web-ui-dashboard.png, the dashboard under a little traffic): the default
model served by build/pagellm, Debian's headless Chromium driven by Selenium
(both installed by tools/setup.sh).

  .venv/bin/python tools/web_ui_screenshot.py [--bin build/pagellm] [--out docs/img]
"""
import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from conftest import Server, default_model_path  # noqa: E402


def traffic(server, stop):
    prompts = ["The capital of France is", "Water boils at", "The largest planet is", "Once upon a time"]
    i = 0
    while not stop.is_set():
        requests.post(server.url("/v1/completions"), json={"prompt": prompts[i % len(prompts)], "max_tokens": 48,
                                                           "temperature": 0.8, "seed": i}, timeout=60)
        i += 1
        time.sleep(0.3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "build" / "pagellm"))
    ap.add_argument("--out", default=str(REPO / "docs" / "img"))
    args = ap.parse_args()
    model = default_model_path()
    server = Server(cmd=None, model=model)
    server.cmd[0] = args.bin
    server.start()
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,760", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver"),
                              options=options)
    stop = threading.Event()
    try:
        driver.get(server.url("/?poll=1000#chat"))
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "model").get_attribute("value"))
        for field, value in (("temperature", "0"), ("max-tokens", "24")):
            el = driver.find_element(By.ID, field)
            el.clear()
            el.send_keys(value)
        driver.find_element(By.ID, "stop").send_keys(".")
        # The pretrained model answers after one example exchange (as in the README).
        driver.execute_script("""
          for (const [role, content] of [['user', 'What is the capital of Germany?'], ['assistant', 'Berlin.']]) {
            chat.messages.push({ role, content });
            addMessage(role, content);
          }""")
        box = driver.find_element(By.ID, "chat-input")
        box.send_keys("What is the capital of France?")
        box.send_keys(Keys.ENTER)
        WebDriverWait(driver, 60).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#messages li.msg.assistant")[-1].get_attribute("data-done"))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out / "web-ui.png"))
        worker = threading.Thread(target=traffic, args=(server, stop), daemon=True)
        worker.start()
        driver.find_element(By.ID, "tab-dashboard").click()
        time.sleep(45)
        driver.save_screenshot(str(out / "web-ui-dashboard.png"))
        print(f"wrote {out / 'web-ui.png'} and {out / 'web-ui-dashboard.png'}")
    finally:
        stop.set()
        driver.quit()
        server.stop()


if __name__ == "__main__":
    main()
