#!/usr/bin/env python3
"""The web UI in a real browser: headless Chromium (Debian's `chromium` + `chromium-driver`,
driven by Python's `selenium`) against `strata server`.

Usage: browser_e2e.py STRATA_BINARY [--model GGUF] [--only fake,key,real] [--out DIR]
       browser_e2e.py --standalone target/release/examples/serve --only fake,key

- fake: the server on the fake engine (`fake_engine` next to STRATA_BINARY, Gemma 3's
  tokenizer from $STRATA_MODEL_DIR or ~/.cache/strata/models). The chat page: a message is
  typed and sent, the streamed answer (the fake engine echoes the prompt) appears, with the
  model's `<b>` shown as text, not markup, and `code` rendered; a second answer is stopped
  with the stop button; the conversation survives a reload (localStorage); a fenced code
  block is rendered with a copy button. The Monitor shows the model name and state of
  /v1/status and the three requests. Screenshots: chat.png,
  monitor.png.
- key: the server with --api-key: the pages load without it, the Monitor shows the 401 until
  the key is typed in, then the data; the chat page uses the stored key.
- real: the real engine on --model (default: `STRATA_BINARY fetch`, the default chat model):
  one chat answer, the Monitor. Screenshots: chat-real.png, monitor-real.png.
Every screenshot must be a valid PNG with many distinct colours. Exit code non-zero on failure.
$CHROMIUM and $CHROMEDRIVER override /usr/bin/chromium and /usr/bin/chromedriver.
"""

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.support.ui import WebDriverWait

FAILED = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILED.append(what)
    return cond


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """`strata server` on a free port, healthy (up to `timeout` s for a model to load)."""

    def __init__(self, binary, flags, timeout=600, key=None, standalone=False):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.key = key
        self.log = tempfile.NamedTemporaryFile(prefix="strata-browser-", suffix=".log", delete=False)
        sub = [] if standalone else ["server"]
        cmd = [binary] + sub + ["--port", str(self.port)] + flags
        print("starting:", " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited:\n" + self.log_text())
            try:
                urllib.request.urlopen(self.base + "/health", timeout=2)
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise RuntimeError("server never became healthy:\n" + self.log_text())

    def status(self):
        req = urllib.request.Request(self.base + "/v1/status")
        if self.key:
            req.add_header("Authorization", "Bearer " + self.key)
        return json.load(urllib.request.urlopen(req, timeout=10))

    def log_text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: graceful, stops the engine too
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name)


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,900", "--no-first-run", "--disable-extensions"]:
        opts.add_argument(a)
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(service=service, options=opts)


def png_colours(path):
    """Distinct pixel colours of an 8-bit RGB(A) or grey PNG (stdlib only: chunks, zlib,
    the five scanline filters). Raises ValueError on a malformed file."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("no PNG signature")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        if zlib.crc32(kind + body) != crc:
            raise ValueError(f"bad CRC in {kind!r}")
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + n
    if ihdr is None:
        raise ValueError("no IHDR")
    w, h, depth, ctype, _, _, interlace = ihdr
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}.get(ctype)
    if depth != 8 or bpp is None or interlace:
        raise ValueError(f"unsupported PNG: depth {depth} colour type {ctype} interlace {interlace}")
    raw = zlib.decompress(idat)
    stride = w * bpp
    if len(raw) != h * (stride + 1):
        raise ValueError("IDAT size does not match IHDR")
    colours, prev = set(), bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            elif f != 0:
                raise ValueError(f"bad filter {f}")
        if y % 4 == 0:  # every fourth row is plenty to count colours
            colours.update(bytes(line[i:i + bpp]) for i in range(0, stride, bpp * 2))
        prev = line
    return w, h, len(colours)


def screenshot(drv, out, name):
    path = os.path.join(out, name)
    check(drv.save_screenshot(path), f"screenshot {path}")
    try:
        w, h, n = png_colours(path)
        check(w >= 800 and h >= 600 and n >= 16, f"{name}: valid PNG {w}x{h}, {n} colours (non-uniform)")
    except ValueError as e:
        check(False, f"{name}: {e}")


def wait(drv, cond, timeout, what):
    try:
        # The page re-renders messages: an element found a moment ago may be gone; poll again.
        WebDriverWait(drv, timeout, poll_frequency=0.1,
                      ignored_exceptions=(StaleElementReferenceException, NoSuchElementException)).until(cond)
        return check(True, what)
    except Exception as e:  # TimeoutException, or the condition raising
        return check(False, f"{what} ({type(e).__name__})")


def text(drv, css):
    els = drv.find_elements(By.CSS_SELECTOR, css)
    return els[-1].text if els else ""


def set_field(drv, id_, value):
    f = drv.find_element(By.ID, id_)
    f.clear()
    f.send_keys(str(value))
    f.send_keys(Keys.TAB)  # fires `change`


def send_message(drv, msg):
    before = len(drv.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
    box = drv.find_element(By.ID, "prompt")
    box.send_keys(msg)
    drv.find_element(By.ID, "send").click()
    return before


def answers(drv):
    return drv.find_elements(By.CSS_SELECTOR, ".msg.assistant")


def done(drv, n):
    a = answers(drv)
    return len(a) > n and a[n].get_attribute("data-done")


def monitor(drv, srv, out, shot, min_recent, timeout=30):
    drv.get(srv.base + "/monitor")
    st = srv.status()
    model, state = st["engine"]["model"], st["engine"]["status"]
    wait(drv, lambda d: d.find_element(By.ID, "engine-model").text == model, timeout,
         f"monitor shows the model {model!r}")
    wait(drv, lambda d: d.find_element(By.ID, "engine-status").text == state, timeout,
         f"monitor shows the engine state {state!r}")
    wait(drv, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#recent tr")) >= min_recent, timeout,
         f"monitor lists >= {min_recent} recent requests")
    check(drv.find_element(By.ID, "machine-cpus").text.strip() not in ("", "–"), "monitor shows the machine")
    check(drv.find_element(By.ID, "live-tps").text.strip() not in ("", "–"), "monitor shows tokens/s")
    check(drv.find_element(By.ID, "state").text == state, "status badge")
    if shot:
        screenshot(drv, out, shot)


def run_fake(drv, args, out):
    flags = ["--engine", args.fake_engine, "--tokenizer", args.tokenizer, "--model-name", "browser-fake",
             "--engine-arg=--delay-ms", "--engine-arg=120"]
    srv = Server(args.binary, flags, timeout=60, standalone=args.standalone)
    try:
        drv.get(srv.base + "/")
        drv.execute_script("localStorage.clear()")
        drv.get(srv.base + "/")
        wait(drv, lambda d: "browser-fake" in d.find_element(By.ID, "model").text, 20, "chat page shows the model")
        stop = drv.find_elements(By.ID, "stop")
        check(len(stop) == 1 and not stop[0].is_enabled(), "stop button exists, disabled while idle")
        set_field(drv, "max_tokens", 64)
        msg = "Hello from the browser test <b>not bold</b> and `code`"
        n = send_message(drv, msg)
        wait(drv, lambda d: len(answers(d)) > n and answers(d)[n].find_element(By.CSS_SELECTOR, ".body").text.strip(), 20,
             "streamed text appears")
        check(drv.find_element(By.ID, "stop").is_enabled(), "stop button enabled while streaming")
        wait(drv, lambda d: done(d, n), 60, "the answer finishes")
        a = answers(drv)[n]
        body = a.find_element(By.CSS_SELECTOR, ".body")
        check(a.get_attribute("data-done") == "ok", f"finished cleanly ({a.get_attribute('data-done')})")
        check("Hello from the browser test <b>not bold</b>" in body.text, f"echoed answer in the DOM: {body.text!r}")
        check(not body.find_elements(By.CSS_SELECTOR, "b, img, script"), "model's markup shown as text")
        check([c.text for c in body.find_elements(By.CSS_SELECTOR, "code")] == ["code"], "inline code rendered")
        check(len(a.find_elements(By.CSS_SELECTOR, "button.copy")) == 1, "copy button on the answer")
        check(not drv.find_element(By.ID, "stop").is_enabled(), "stop disabled again")
        screenshot(drv, out, "chat.png")

        # Stop: the second answer is cut after its first text.
        n = send_message(drv, "A second message to be stopped early, with quite a few words in it")
        wait(drv, lambda d: len(answers(d)) > n and answers(d)[n].find_element(By.CSS_SELECTOR, ".body").text.strip(), 20,
             "second answer starts")
        drv.find_element(By.ID, "stop").click()
        wait(drv, lambda d: done(d, n), 10, "stop ends the stream")
        check(answers(drv)[n].get_attribute("data-done") == "(stopped)", "answer marked stopped")
        check("quite a few words" not in answers(drv)[n].text, "stopped before the whole echo")

        # The conversation is kept in localStorage.
        drv.refresh()
        wait(drv, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg")) == 4, 10, "conversation restored after reload")
        check(len(drv.find_elements(By.CSS_SELECTOR, "#conversations li")) == 1, "one conversation listed")
        drv.find_element(By.ID, "new-chat").click()
        check(len(drv.find_elements(By.CSS_SELECTOR, "#conversations li")) == 2, "new chat listed")

        # A fenced code block (typed with newlines) is rendered with its own copy button.
        box = drv.find_element(By.ID, "prompt")
        drv.execute_script("arguments[0].value = arguments[1]", box, "Code:\n```python\nprint(1 < 2)\n```\ndone")
        n = len(answers(drv))
        drv.find_element(By.ID, "send").click()
        wait(drv, lambda d: done(d, n), 30, "code answer finishes")
        a = answers(drv)[n]
        code = a.find_elements(By.CSS_SELECTOR, ".codeblock pre code")
        check(len(code) == 1 and code[0].text == "print(1 < 2)", f"code block rendered: {[c.text for c in code]}")
        btn = a.find_elements(By.CSS_SELECTOR, ".codebar button.copy")
        check(len(btn) == 1 and btn[0].text == "Copy code", "copy-code button")
        if btn:
            btn[0].click()
            wait(drv, lambda d: btn[0].text in ("Copied", "Copy failed"), 5, f"copy-code clicked: {btn[0].text!r}")

        monitor(drv, srv, out, "monitor.png", min_recent=3)
    except Exception:
        print(srv.log_text(), file=sys.stderr)
        raise
    finally:
        srv.stop()


def run_key(drv, args, out):
    key = "browser-key-%d" % os.getpid()
    flags = ["--engine", args.fake_engine, "--tokenizer", args.tokenizer, "--model-name", "keyed-fake", "--api-key", key,
             # Explicit engine args: without any, `strata server` gives the engine its own options.
             "--engine-arg=--name", "--engine-arg=fake"]
    srv = Server(args.binary, flags, timeout=60, key=key, standalone=args.standalone)
    try:
        drv.get(srv.base + "/monitor")
        drv.execute_script("localStorage.clear()")
        drv.get(srv.base + "/monitor")
        wait(drv, lambda d: "401" in d.find_element(By.ID, "error").text, 10, "monitor without the key shows the 401")
        set_field(drv, "api-key", key)
        wait(drv, lambda d: d.find_element(By.ID, "engine-model").text == "keyed-fake", 10, "monitor with the key shows data")
        drv.get(srv.base + "/")
        wait(drv, lambda d: "keyed-fake" in d.find_element(By.ID, "model").text, 10, "chat page uses the stored key")
        set_field(drv, "max_tokens", 16)
        n = send_message(drv, "keyed hello")
        wait(drv, lambda d: done(d, n), 30, "keyed answer finishes")
        check(answers(drv)[n].get_attribute("data-done") in ("ok", "(stopped at max_tokens)"), "keyed answer ok")
    finally:
        srv.stop()


def run_real(drv, args, out):
    srv = Server(args.binary, ["--engine-arg=-m", "--engine-arg=" + args.model], timeout=900)
    try:
        drv.get(srv.base + "/")
        drv.execute_script("localStorage.clear()")
        drv.get(srv.base + "/")
        wait(drv, lambda d: d.find_element(By.ID, "model").text.startswith("Model: "), 30, "chat page shows the model")
        set_field(drv, "max_tokens", 48)
        set_field(drv, "temperature", 0)
        n = send_message(drv, "Write one short sentence about the sea.")
        wait(drv, lambda d: done(d, n), 600, "real answer finishes")
        a = answers(drv)[n]
        check(a.get_attribute("data-done") in ("ok", "(stopped at max_tokens)"), f"real answer ended well ({a.get_attribute('data-done')})")
        t = a.find_element(By.CSS_SELECTOR, ".body").text.strip()
        check(len(t) > 0, f"real answer in the DOM: {t[:120]!r}")
        screenshot(drv, out, "chat-real.png")
        monitor(drv, srv, out, "monitor-real.png", min_recent=1)
    except Exception:
        print(srv.log_text(), file=sys.stderr)
        raise
    finally:
        srv.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("binary")
    p.add_argument("--model", help="GGUF for the real engine (default: `STRATA_BINARY fetch`)")
    p.add_argument("--fake-engine")
    p.add_argument("--tokenizer")
    p.add_argument("--only", default="fake,key,real")
    p.add_argument("--out", default="/tmp/strata-browser")
    p.add_argument("--standalone", action="store_true",
                   help="BINARY is the server itself (target/release/examples/serve), not `strata`")
    args = p.parse_args()
    args.binary = os.path.abspath(args.binary)
    args.fake_engine = args.fake_engine or os.path.join(os.path.dirname(args.binary), "fake_engine")
    models = os.environ.get("STRATA_MODEL_DIR") or os.path.expanduser("~/.cache/strata/models")
    args.tokenizer = args.tokenizer or os.path.join(models, "gemma-3-270m-q4_k_m.gguf")
    only = set(args.only.split(","))
    os.makedirs(args.out, exist_ok=True)
    if "real" in only and not args.model:
        args.model = subprocess.run([args.binary, "fetch"], check=True, capture_output=True, text=True).stdout.strip()
    drv = browser()
    try:
        for name, fn in [("fake", run_fake), ("key", run_key), ("real", run_real)]:
            if name in only:
                print(f"== {name}", flush=True)
                try:
                    fn(drv, args, args.out)
                except Exception as e:
                    check(False, f"{name}: {type(e).__name__}: {e}")
    finally:
        drv.quit()
    print(f"browser_e2e: {len(FAILED)} failure(s); screenshots in {args.out}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
