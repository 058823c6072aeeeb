"""The dashboard in a real browser (Debian's chromium, headless, driven by
Playwright), against `cortex serve` and real `cortex worker` processes.

Usage: dashboard.py SETTINGS.json (url, keyed_url, key, chromium, artifacts,
and how to run cortex: binary, dir, env). Every page is saved as a
screenshot in `artifacts`.
"""

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

settings = json.loads(Path(sys.argv[1]).read_text())
URL = settings["url"]
ARTIFACTS = Path(settings["artifacts"])
DIR = Path(settings["cortex"]["dir"])
ENV = dict(os.environ, **settings["cortex"]["env"])
for name in ("CORTEX_DB", "CORTEX_MODEL", "CORTEX_PARALLEL"):
    ENV.pop(name, None)
LONG = 240_000  # ms: the longest a page may take to show what a worker did


def cortex(*args, check=True):
    done = subprocess.run(
        [settings["cortex"]["binary"], *args], cwd=DIR, env=ENV, capture_output=True, text=True
    )
    if check and done.returncode != 0:
        raise AssertionError(f"cortex {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done


def spawn(*args):
    return subprocess.Popen(
        [settings["cortex"]["binary"], *args], cwd=DIR, env=ENV,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def job_id(submitted):
    return int(re.search(r"job (\d+) submitted", submitted.stdout + submitted.stderr).group(1))


def api(path):
    with urllib.request.urlopen(URL + path) as response:
        return json.load(response)


def write(name, lines):
    path = DIR / name
    path.write_text("".join(json.dumps(line) + "\n" if not isinstance(line, str) else line + "\n" for line in lines))
    return path


def chat_line(custom_id, content, max_tokens, url="/v1/chat/completions"):
    return {
        "custom_id": custom_id, "method": "POST", "url": url,
        "body": {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0},
    }


def shot(page, name):
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    print(f"screenshot {ARTIFACTS / name}.png")


def state_is(page, state):
    expect(page.locator(f"#job-title .state-{state}")).to_be_visible(timeout=LONG)


# Batch lines and, as `cortex submit` takes them, plain lines (no url): the
# dashboard's upload takes both.
good = write("good.jsonl", [chat_line(f"fact-{i}", f"Give one fact about the number {i}.", 16) for i in range(1, 13)] + [
    {"custom_id": "plain-prompt", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
    {"custom_id": "plain-chat", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0},
])
bad = write("bad.jsonl", [
    json.dumps(chat_line("ok-1", "Hello", 8)),
    "{not json",
    json.dumps({"custom_id": "no-messages", "method": "POST", "url": "/v1/chat/completions", "body": {"max_tokens": 5}}),
])
long = write("long.jsonl", [chat_line(f"story-{i}", f"Write a long story about a fox called {i}.", 48) for i in range(1, 81)])
gemma_chat = write("gemma-chat.jsonl", [chat_line(f"gemma-{i}", f"Name a colour, {i}.", 8) for i in range(1, 4)])

with sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=settings["chromium"], args=["--no-sandbox"])
    context = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page_errors = []
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    page.goto(URL + "/")
    expect(page.locator("h1")).to_have_text("Jobs")

    # A file with bad lines: each line's error, as `cortex submit` reports it.
    page.set_input_files("#upload-file", str(bad))
    page.click("#upload-submit")
    errors = page.locator("#upload-errors li")
    expect(errors).to_have_count(2, timeout=30_000)
    shown = errors.all_text_contents()
    refused = cortex("submit", str(bad), check=False)
    assert refused.returncode != 0, "cortex submit accepted a bad file"
    for text in shown:
        line, message = re.match(r"line (\d+): (.*)", text).groups()
        reported = [l for l in refused.stderr.splitlines() if f"line {line}" in l]
        assert reported and message in reported[0], f"page: {text!r}\ncortex submit:\n{refused.stderr}"
    assert [re.match(r"line (\d+)", t).group(1) for t in shown] == ["2", "3"], shown
    shot(page, "upload-errors")
    listed = api("/v1/jobs")
    assert listed["matching"] == 0, "a file with bad lines submitted a job"
    # The refused batch stays listed with its errors.
    assert len(listed["rejected"]) == 1, listed["rejected"]
    expect(page.locator("#rejected tbody tr")).to_have_count(1)
    expect(page.locator("#rejected")).to_contain_text(shown[0])

    # A good file: the page follows it to completion without a reload.
    page.set_input_files("#upload-file", str(good))
    page.click("#upload-submit")
    page.click("#started-job")
    state_is(page, "in_progress")
    page.evaluate("window.__same_page = true")
    shot(page, "job-pending")
    worker = spawn("worker", "--parallel", "4")
    state_is(page, "completed")
    assert worker.wait(timeout=120) == 0, worker.stderr.read()
    assert page.evaluate("window.__same_page") is True, "the page reloaded"
    expect(page.locator("#job-header [role=progressbar]")).to_have_attribute("aria-valuenow", "14")

    # One item whole, and the output file, each as `cortex results` has it.
    cortex("results", "1", "-o", "results-1.jsonl", "--errors", "errors-1.jsonl")
    results = [json.loads(l) for l in (DIR / "results-1.jsonl").read_text().splitlines()]
    choice = lambda r: r["response"]["body"]["choices"][0]
    contents = {r["custom_id"]: choice(r).get("message", {}).get("content", choice(r).get("text")) for r in results}
    assert contents["plain-prompt"] and contents["plain-chat"], contents
    page.click("#items-table tr[data-line='3']")
    expect(page.locator("#item-output")).to_be_visible()
    assert page.locator("#item-output").text_content() == contents["fact-3"]
    expect(page.locator("#item")).to_contain_text("pid")
    expect(page.locator("#item-request")).to_contain_text("number 3")
    shot(page, "job-completed")
    with page.expect_download() as download:
        page.click("#download-output")
    downloaded = [json.loads(l) for l in Path(download.value.path()).read_text().splitlines()]
    assert downloaded == results, "the downloaded output differs from `cortex results`"
    page.fill("#items-search", "fact-1")
    expect(page.locator("#items-table tbody tr")).to_have_count(4)  # fact-1, fact-10, 11, 12

    # Lines `--skip-invalid` refused are failed items, with their line and error.
    skipped = job_id(cortex("submit", str(bad), "--skip-invalid"))
    failed_items = api(f"/v1/jobs/{skipped}/items?state=failed")["data"]
    assert [i["line"] for i in failed_items] == [2, 3], failed_items
    assert all(i["error_code"] == "invalid_input" and i["error_message"] for i in failed_items), failed_items
    assert api(f"/v1/jobs/{skipped}/items/3")["line"] == 3
    page.goto(f"{URL}/#/jobs/{skipped}")
    expect(page.locator("#items-table tbody tr")).to_have_count(3)
    page.click("#items-table tr[data-line='2']")
    expect(page.locator("#item")).to_contain_text("invalid_input")

    # The server: the loaded model, live gauges, the workers on the queue.
    running = job_id(cortex("submit", str(long)))
    server_page = context.new_page()
    server_page.on("pageerror", lambda error: page_errors.append(str(error)))
    server_page.goto(URL + "/#/server")
    expect(server_page.locator("#models")).to_contain_text("smollm2-135m")
    worker = spawn("worker", "--parallel", "2")
    expect(server_page.locator("#workers tbody tr")).to_have_count(1, timeout=LONG)
    expect(server_page.locator("#gauges")).to_contain_text("Running sequences")
    server_page.wait_for_timeout(4000)  # a few points on each chart
    shot(server_page, "server")
    server_page.close()

    # Cancel a running job, then resume it.
    page.goto(f"{URL}/#/jobs/{running}")
    page.wait_for_function(
        "() => Number(document.querySelector('#job-header [role=progressbar]')?.getAttribute('aria-valuenow')) > 0",
        timeout=LONG,
    )
    page.click("#action-cancel")
    state_is(page, "cancelled")
    assert worker.wait(timeout=120) == 0, worker.stderr.read()
    counts = api(f"/v1/jobs/{running}")["job"]["counts"]
    assert counts["cancelled"] > 0 and counts["completed"] > 0, counts
    shot(page, "job-cancelled")
    page.click("#action-resume")
    state_is(page, "in_progress")
    cortex("worker")
    state_is(page, "completed")
    assert api(f"/v1/jobs/{running}")["job"]["counts"]["completed"] == 80

    # Retry failed items: Gemma 3 270M's GGUF has no chat template of its
    # own (its registry entry names one), so named by its file its chats
    # fail in a worker given none.
    gemma_file = DIR / "gemma-plain.gguf"
    gemma_file.symlink_to(cortex("models", "pull", "gemma3-270m").stdout.strip().splitlines()[-1])
    gemma = ("--model", str(gemma_file))
    failing = job_id(cortex(*gemma, "--chat-template", "gemma", "submit", str(gemma_chat)))
    cortex(*gemma, "worker")
    page.goto(f"{URL}/#/jobs/{failing}")
    state_is(page, "failed")
    page.select_option("#items-state", "failed")
    expect(page.locator("#items-table tbody tr")).to_have_count(3)
    page.click("#items-table tr[data-line='1']")
    expect(page.locator("#item-error")).to_contain_text("no chat template")
    shot(page, "job-failed")
    page.click("#action-retry")
    state_is(page, "in_progress")
    cortex(*gemma, "--chat-template", "gemma", "worker")
    state_is(page, "completed")
    page.select_option("#items-state", "completed")
    expect(page.locator("#items-table tbody tr")).to_have_count(3, timeout=LONG)

    # The job list: filters, and a phone-sized screen.
    page.goto(URL + "/")
    expect(page.locator("#jobs tbody tr")).to_have_count(4)
    page.select_option("#filter-model", "gemma-plain:latest")
    expect(page.locator("#jobs tbody tr")).to_have_count(1)
    page.select_option("#filter-model", "")
    page.select_option("#filter-state", "completed")
    expect(page.locator("#jobs tbody tr")).to_have_count(4, timeout=LONG)
    page.select_option("#filter-state", "")
    shot(page, "jobs")
    unlabelled = page.evaluate(
        "() => [...document.querySelectorAll('input, select')].filter(e => e.labels.length === 0).map(e => e.id)"
    )
    assert not unlabelled, f"form fields without a label: {unlabelled}"
    # By keyboard: a job's row opens with Enter.
    page.focus("#jobs tr[data-job='1']")
    page.keyboard.press("Enter")
    state_is(page, "completed")
    expect(page.locator("#job-title")).to_contain_text("Job #1")
    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2)
    small = phone.new_page()
    small.goto(f"{URL}/#/jobs/1")
    state_is(small, "completed")
    assert small.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), "the page is wider than a phone"
    shot(small, "job-phone")
    phone.close()

    # A keyed server: the page asks for a key once and sends it.
    keyed = browser.new_context(viewport={"width": 1280, "height": 900})
    page = keyed.new_page()
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    page.goto(settings["keyed_url"] + "/")
    expect(page.locator("#key-dialog")).to_be_visible(timeout=30_000)
    shot(page, "key-prompt")
    page.fill("#key-input", "not-the-key")
    page.click("#key-submit")
    expect(page.locator("#key-why")).to_contain_text("refused")
    expect(page.locator("#key-dialog")).to_be_visible()
    page.fill("#key-input", settings["key"])
    page.click("#key-submit")
    expect(page.locator("#jobs tbody tr")).to_have_count(4, timeout=30_000)
    page.goto(settings["keyed_url"] + "/#/jobs/1")
    state_is(page, "completed")
    assert not page.locator("#key-dialog").is_visible(), "the key was asked for twice"
    keyed.close()

    assert not page_errors, page_errors
    browser.close()
print("dashboard: every check passed")
