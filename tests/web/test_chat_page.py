"""The chat page of `mica serve` in a real headless Chromium: the model picker, an answer
streamed token by token with its numbers (the server's usage), stop (and the server freeing
the sequence), regenerate, edit, Markdown rendered and sanitized, conversations kept across
a reload, export as JSON and import, the API-key prompt, keyboard-only use, and a phone-sized
layout — with no console errors."""

from __future__ import annotations

import json
import time

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from conftest import Browser

LONG = "Count from 1 to 500, separated by commas."


def wait(b: Browser, cond, timeout: float = 60, what: str = ""):
    return WebDriverWait(b.driver, timeout, poll_frequency=0.02).until(
        lambda d: cond(), message=what)


def js(b: Browser, script: str, *args):
    return b.driver.execute_script(script, *args)


def el(b: Browser, css: str):
    return b.driver.find_element(By.CSS_SELECTOR, css)


def open_page(b: Browser, url: str, models=("alpha", "smol")):
    b.driver.get(url + "/")
    wait(b, lambda: [o.text for o in Select(el(b, "#model")).options] == list(models),
         what="the model list")


def answers(b: Browser) -> list[str]:
    return js(b, "return [...document.querySelectorAll('#messages .msg.assistant .body')]"
                 ".map(e => e.textContent)")


def running(b: Browser) -> bool:
    return js(b, "return document.body.classList.contains('running')")


def settle(b: Browser, timeout: float = 60):
    wait(b, lambda: not running(b), timeout, "the answer to end")


def set_setting(b: Browser, css: str, value: str):
    if not el(b, "#settings").is_displayed():
        el(b, "#settings-toggle").click()
    box = el(b, css)
    box.clear()
    box.send_keys(value)
    box.send_keys(Keys.TAB)  # `change` fires on leaving the field


def kept(b: Browser) -> list[str]:
    """The current conversation's answers as kept in localStorage (raw Markdown)."""
    return js(b, "const all = JSON.parse(localStorage.getItem('mica.conversations.v1'));"
                 "const c = all.reduce((a, b) => b.updated > a.updated ? b : a);"
                 "return c.messages.filter(m => m.role === 'assistant').map(m => m.content)")


def stats(b: Browser) -> list[str]:
    return js(b, "return [...document.querySelectorAll('#messages .msg.assistant .stats')]"
                 ".map(e => e.textContent)")


def exported(b: Browser):
    """The one downloaded export file's JSON, or None until it is there and complete."""
    files = list(b.downloads.glob("*.json"))
    if len(files) != 1 or list(b.downloads.glob("*.crdownload")):
        return None
    try:
        return json.loads(files[0].read_text())
    except json.JSONDecodeError:
        return None


def idle(srv) -> bool:
    return srv.get_json("/admin/requests")["requests"] == []


def test_chat_streams_stops_and_keeps_conversations(server, browser):
    b = browser
    open_page(b, server.url)
    Select(el(b, "#model")).select_by_value("smol")
    set_setting(b, "#temperature", "0")
    set_setting(b, "#max-tokens", "40")
    el(b, "#system").send_keys("You are a helpful assistant.")

    # An answer streamed token by token: its text grows across polls while it runs.
    el(b, "#input").send_keys("Write a short poem about the sea.")
    el(b, "#send").click()
    lengths = []
    wait(b, lambda: running(b), 10, "the answer to start")
    while running(b):
        a = answers(b)
        if a and a[-1] and (not lengths or len(a[-1]) != lengths[-1]):
            lengths.append(len(a[-1]))
        time.sleep(0.01)
    # (Markdown may re-render a line as a list as it grows: the text need not grow at every
    # poll, but it changes many times and ends longer than it began.)
    assert len(lengths) >= 3 and lengths[-1] > lengths[0], lengths
    first = answers(b)[-1]
    assert first.strip()
    s = stats(b)[-1]
    # The server's usage (stream_options.include_usage): an exact count, at most max_tokens.
    assert not s.startswith("≈"), s
    tokens = int(s.split(" tokens")[0])
    assert 1 <= tokens <= 40, s
    assert "tok/s" in s and "first token" in s and "prompt" in s, s

    # Stop a long answer: the page keeps what came, the server frees the sequence.
    set_setting(b, "#max-tokens", "")
    el(b, "#input").send_keys(LONG)
    el(b, "#input").send_keys(Keys.ENTER)
    wait(b, lambda: len(answers(b)) == 2 and len(answers(b)[-1]) > 20, 60, "the long answer")
    el(b, "#stop").click()
    settle(b, 10)
    stopped = kept(b)[-1]
    assert stopped.strip() and "stopped" in stats(b)[-1], (stopped, stats(b))
    wait(b, lambda: idle(server), 10, "the server to free the stopped request")
    time.sleep(0.3)
    assert kept(b)[-1] == stopped, "text arrived after stop"

    # Regenerate the last answer (bounded this time).
    set_setting(b, "#max-tokens", "12")
    el(b, "#messages .msg.assistant:last-child .regenerate").click()
    wait(b, lambda: running(b), 10)
    settle(b)
    assert len(answers(b)) == 2 and "stopped" not in stats(b)[-1]
    regenerated = kept(b)[-1]
    assert regenerated.strip() and regenerated != stopped

    # Edit the first message: the conversation is re-run from there.
    el(b, "#messages .msg.user .edit").click()
    area = el(b, "#messages .edit-area")
    area.clear()
    area.send_keys("Name three colors.")
    area.send_keys(Keys.ENTER)
    wait(b, lambda: running(b), 10)
    settle(b)
    users = [e.text for e in b.driver.find_elements(By.CSS_SELECTOR, "#messages .msg.user .body")]
    assert users == ["Name three colors."] and len(answers(b)) == 1, users

    # A second conversation, then a reload: both are listed and the current one is shown.
    el(b, "#new-chat").click()
    el(b, "#input").send_keys("Hello!")
    el(b, "#input").send_keys(Keys.ENTER)
    wait(b, lambda: running(b), 10)
    settle(b)
    b.driver.refresh()
    open_page(b, server.url)
    titles = [e.text for e in b.driver.find_elements(By.CSS_SELECTOR, "#conversations .open")]
    assert titles == ["Hello!", "Name three colors."], titles
    assert [e.text for e in b.driver.find_elements(By.CSS_SELECTOR, "#messages .msg.user")]
    b.driver.find_elements(By.CSS_SELECTOR, "#conversations .open")[1].click()
    assert el(b, "#messages .msg.user .body").text == "Name three colors."
    assert el(b, "#system").get_attribute("value") == "You are a helpful assistant."
    assert Select(el(b, "#model")).first_selected_option.text == "smol"

    # Export: a JSON file with both conversations, their messages, model and numbers.
    el(b, "#export").click()
    # Chromium may create the file before it has written it: wait for the whole document.
    wait(b, lambda: exported(b) is not None, 10, "the export file")
    data = exported(b)
    assert data["format"] == "mica-chat" and data["version"] == 1
    convs = {c["title"]: c for c in data["conversations"]}
    assert set(convs) == {"Hello!", "Name three colors."}
    c = convs["Name three colors."]
    assert c["model"] == "smol" and c["system"] == "You are a helpful assistant."
    assert [m["role"] for m in c["messages"]] == ["user", "assistant"]
    assert c["messages"][1]["content"].strip() and c["messages"][1]["stats"]["exact"] is True
    stored = js(b, "return JSON.parse(localStorage.getItem('mica.conversations.v1'))")
    assert data["conversations"] == stored

    # Delete one: gone from the list and from storage after a reload.
    b.driver.find_elements(By.CSS_SELECTOR, "#conversations .delete")[0].click()
    b.driver.refresh()
    open_page(b, server.url)
    titles = [e.text for e in b.driver.find_elements(By.CSS_SELECTOR, "#conversations .open")]
    assert len(titles) == 1, titles


def test_import_renders_markdown_safely(server, browser, tmp_path):
    b = browser
    open_page(b, server.url)
    answer = ("Some **bold** text and a list:\n\n- one\n- two\n\n"
              "```python\ndef f(x):\n    return x + 1\n```\n\n"
              "<img src=x onerror=\"window.pwned=1\"> <script>window.pwned=2</script>\n\n"
              "[link](javascript:window.pwned=3)")
    f = tmp_path / "chats.json"
    f.write_text(json.dumps({"format": "mica-chat", "version": 1, "conversations": [
        {"id": "x1", "title": "Imported", "model": "smol", "system": "",
         "created": 1, "updated": 2,
         "messages": [{"role": "user", "content": "<b>not bold</b>"},
                      {"role": "assistant", "content": answer}]}]}))
    el(b, "#import-file").send_keys(str(f))
    wait(b, lambda: len(answers(b)) == 1, 10, "the imported conversation")
    body = el(b, "#messages .msg.assistant .body")
    assert body.find_element(By.TAG_NAME, "strong").text == "bold"
    assert len(body.find_elements(By.CSS_SELECTOR, "ul li")) == 2
    code = body.find_element(By.CSS_SELECTOR, "pre code.hljs")
    assert code.find_elements(By.CSS_SELECTOR, ".hljs-keyword"), "not highlighted"
    assert "return x + 1" in code.text
    # Raw HTML from the model is text, never markup; no script ran.
    assert not body.find_elements(By.CSS_SELECTOR, "img, script")
    assert "<img" in body.text
    link = body.find_element(By.TAG_NAME, "a")
    assert not (link.get_attribute("href") or "").startswith("javascript:")
    assert el(b, "#messages .msg.user .body").text == "<b>not bold</b>"
    assert js(b, "return window.pwned === undefined")
    # A broken file is refused with a message.
    bad = tmp_path / "bad.json"
    bad.write_text('{"conversations": [{"messages": [{"role": "wizard", "content": 1}]}]}')
    el(b, "#import-file").send_keys(str(bad))
    wait(b, lambda: "Import failed" in el(b, "#status").text, 5)
    assert len(b.driver.find_elements(By.CSS_SELECTOR, "#conversations li")) == 1


def test_keyboard_only(server, browser):
    b = browser
    open_page(b, server.url)
    # Greedy, so the long answer below is long every run (sampled at the page's default
    # 0.7, the model may answer the count in a few characters); stored before the page
    # loads again, so the rest of the test uses the keyboard only.
    js(b, "localStorage.setItem('mica.settings.v1', JSON.stringify({temperature: 0}))")
    open_page(b, server.url)
    d = b.driver
    keys = ActionChains(d)

    def active(attr: str = "id") -> str:
        return d.switch_to.active_element.get_attribute(attr)

    assert active() == "input", "the message box has focus on load"
    # Tab order: the message box, then Send; focus is visible.
    keys.send_keys(Keys.TAB).perform()
    assert active() == "send"
    assert js(b, "return document.activeElement.matches(':focus-visible')")
    keys.key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()
    assert active() == "input"
    # Shift+Enter is a new line, Enter sends.
    ActionChains(d).send_keys("Say hi.").key_down(Keys.SHIFT).send_keys(Keys.ENTER) \
        .key_up(Keys.SHIFT).send_keys("Briefly.").perform()
    assert el(b, "#input").get_attribute("value") == "Say hi.\nBriefly."
    ActionChains(d).send_keys(Keys.ENTER).perform()
    wait(b, lambda: running(b) or len(answers(b)) == 1, 10)
    settle(b)
    assert el(b, "#messages .msg.user .body").text == "Say hi.\nBriefly."
    assert answers(b)[-1].strip()
    assert active() == "input", "focus returns to the message box"
    # Escape stops a long answer.
    ActionChains(d).send_keys(LONG).send_keys(Keys.ENTER).perform()
    wait(b, lambda: len(answers(b)) == 2 and len(answers(b)[-1]) > 10, 60, "the long answer")
    ActionChains(d).send_keys(Keys.ESCAPE).perform()
    settle(b, 10)
    assert "stopped" in stats(b)[-1]
    wait(b, lambda: idle(server), 10, "the server to free the stopped request")
    # Every control is reachable with Tab.
    seen = set()
    for _ in range(40):
        ActionChains(d).send_keys(Keys.TAB).perform()
        seen.add(active() or active("class"))
    assert {"new-chat", "export", "import", "model", "settings-toggle", "input", "send"} <= seen, seen


def test_api_key_prompt(keyed_server, browser):
    b = browser
    # The page asks /v1/models first without a key: the browser logs that 401.
    b.allowed_errors = ("v1/models - Failed to load resource: the server responded with a status of 401",)
    b.driver.get(keyed_server.url + "/")
    wait(b, lambda: el(b, "#key-dialog").is_displayed(), 10, "the key prompt")
    assert "needs an API key" in el(b, "#key-message").text
    box = el(b, "#key-input")
    assert b.driver.switch_to.active_element == box
    box.send_keys("wrong")
    box.send_keys(Keys.ENTER)
    wait(b, lambda: el(b, "#key-dialog").is_displayed()
         and "refused" in el(b, "#key-message").text, 10, "the prompt again")
    box.clear()
    box.send_keys(keyed_server.key)
    box.send_keys(Keys.ENTER)
    wait(b, lambda: not el(b, "#key-dialog").is_displayed(), 10)
    wait(b, lambda: len(Select(el(b, "#model")).options) == 2, 10, "the models")
    assert js(b, "return localStorage.getItem('mica.apiKey')") == keyed_server.key
    set_setting(b, "#max-tokens", "8")
    el(b, "#input").send_keys("Hi", Keys.ENTER)
    wait(b, lambda: running(b), 10)
    settle(b)
    assert answers(b)[-1].strip() and "tokens" in stats(b)[-1]
    # Kept across a reload: no prompt, and no further 401.
    before = len(b.errors())
    b.driver.refresh()
    wait(b, lambda: len(Select(el(b, "#model")).options) == 2, 10, "the models")
    assert not el(b, "#key-dialog").is_displayed()
    assert len(b.errors()) == before


def test_phone_layout_and_errors(server, browser, artifacts):
    b = browser
    b.driver.set_window_size(390, 844)
    open_page(b, server.url)
    # A request the server refuses (more tokens than the context holds): its message is
    # shown and no empty answer is left.
    b.allowed_errors = ("v1/chat/completions - Failed to load resource: the server responded "
                        "with a status of 400",)
    set_setting(b, "#max-tokens", "100000")
    el(b, "#input").send_keys("Hi", Keys.ENTER)
    wait(b, lambda: "context" in el(b, "#status").text, 10, "the error")
    assert "error" in el(b, "#status").get_attribute("class")
    assert answers(b) == []
    assert js(b, "return document.documentElement.scrollWidth <= window.innerWidth")
    assert not el(b, "#sidebar").is_displayed() and el(b, "#toggle-sidebar").is_displayed()
    set_setting(b, "#max-tokens", "16")
    el(b, "#settings-toggle").click()
    el(b, "#input").send_keys("What is the capital of France?", Keys.ENTER)
    wait(b, lambda: running(b), 10)
    settle(b)
    assert js(b, "return document.documentElement.scrollWidth <= window.innerWidth")
    el(b, "#toggle-sidebar").click()
    wait(b, lambda: el(b, "#new-chat").is_displayed(), 5, "the sidebar")
    assert b.driver.switch_to.active_element == el(b, "#new-chat")
    time.sleep(0.3)  # the sidebar slides in
    b.screenshot(artifacts, "phone-sidebar")
    b.driver.find_elements(By.CSS_SELECTOR, "#conversations .open")[0].click()
    wait(b, lambda: not el(b, "#new-chat").is_displayed(), 5, "the sidebar to close")
