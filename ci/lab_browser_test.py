"""What a learner sees in the lab, checked with headless Chromium through Selenium.

    python ci/lab_browser_test.py --url http://127.0.0.1:PORT/ --token TOKEN \\
        --screenshot build/lab/NAME.png [--timeout S]

It drives a running JupyterLab (however it was started: `make lab`, a Docker container) the way
a learner does, and stops at the first thing that is wrong, with a message naming it:

1. without the token the lab is refused: the login page, also after a wrong token;
2. with the token's URL the JupyterLab UI loads;
3. the file browser lists the six notebooks of notebooks/ (01_ ... 06_) in order;
4. notebook 01 opened from the file browser and run with the Run menu's "Restart Kernel and Run All
   Cells" finishes: every code cell gets its execution count (1..N, in order), the kernel goes idle,
   no cell shows an error,
   and the output areas hold one rendered image per figure the notebook shows (`plt.show()`);
5. a screenshot of the lab with notebook 01 executed is saved (and its path printed); on a failure
   the screenshot shows the failure instead.

Notebook 01 runs at the scale of the lab's environment: start the lab with EMBEDLAB_SCALE=ci
(ci/lab_test.sh and ci/docker_test.sh do).

The notebook file is not modified: autosave is turned off from the Settings menu before the
notebook is opened (and turned back on at the end when it was on), the notebook is closed with
"Discard" and its kernel shut down, and the file's text and modification time are compared with
what they were before. The REST API is only read (what the server lists, the file's text, the
sessions); everything that runs code goes through the UI.

Chromium runs headless with a fresh profile and with what it needs as root and on a machine with
no outside network (no sandbox, no GPU, no QUIC, no background or component updates).
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import (NoSuchElementException, StaleElementReferenceException, TimeoutException,
                                        WebDriverException)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

NOTEBOOK_DIR = "notebooks"
NOTEBOOK_PATTERN = re.compile(r"^(\d\d)_[A-Za-z0-9_]+\.ipynb$")
EXPECTED_PREFIXES = ["01", "02", "03", "04", "05", "06"]
AUTOSAVE_SETTINGS = "lab/api/settings/@jupyterlab/docmanager-extension:plugin"
UI_TIMEOUT = 120          # seconds for one UI step (page load, a menu, the kernel starting) on a loaded machine
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-crash-reporter", "--disable-breakpad", "--disable-dev-shm-usage", "--window-size=1600,1000"]

# The state of the open notebook, read from the DOM in one call: the input prompts of its code
# cells ("[ ]:", "[*]:", "[12]:"), the kernel indicator of its toolbar, its error and stderr
# outputs (both rendered with the stderr MIME type; an error is the one with a traceback), its
# images and the text of any open dialog (kernel died, kernel choice).
NOTEBOOK_STATE_JS = r"""
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
const dialog = document.querySelector('.jp-Dialog');
const out = {found: !!panel, dialog: dialog ? dialog.innerText : null};
if (!panel) return out;
const cells = [...panel.querySelectorAll('.jp-Notebook .jp-Cell.jp-CodeCell')];
out.prompts = cells.map(c => { const p = c.querySelector('.jp-InputPrompt'); return p ? p.textContent.trim() : null; });
const ind = panel.querySelector('.jp-Notebook-ExecutionIndicator');
out.kernel = ind ? ind.getAttribute('data-status') : null;
out.errors = []; out.stderr = [];
cells.forEach((c, i) => {
  c.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').forEach(o => {
    const text = o.innerText;
    (/Traceback \(most recent call last\)|^\s*\w+(Error|Exception)\b/m.test(text) ? out.errors : out.stderr)
      .push({cell: i, text: text.slice(-1500)});
  });
});
const imgs = [...panel.querySelectorAll('.jp-OutputArea-output img')];
out.images = imgs.length;
out.images_rendered = imgs.filter(im => im.complete && im.naturalWidth > 0 && im.naturalHeight > 0).length;
return out;
"""


class Failed(Exception):
    """A check that failed: the message says what the learner would see go wrong."""


def log(msg):
    print(f"lab_browser_test: {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# The server, read (never written) through its REST API with the token.

class Server:
    def __init__(self, url, token):
        self.url = url if url.endswith("/") else url + "/"
        self.token = token

    def get(self, path, token=True, **query):
        url = urllib.parse.urljoin(self.url, path)
        if query:
            url += "?" + urllib.parse.urlencode(query)
        req = urllib.request.Request(url)
        if token:
            req.add_header("Authorization", f"token {self.token if token is True else token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            raise Failed(f"the lab at {self.url} did not answer {path}: {e}") from None

    def json(self, path, **query):
        status, body = self.get(path, **query)
        if status != 200:
            raise Failed(f"GET {path} answered HTTP {status} with the token: {body[:300]!r}")
        return json.loads(body)

    def api_path(self, rel):
        return "api/contents/" + urllib.parse.quote(rel)

    def file_state(self, rel):
        """(last_modified, sha256 of the raw text) of a file of the lab."""
        model = self.json(self.api_path(rel), type="file", format="text", content="1")
        return model["last_modified"], hashlib.sha256(model["content"].encode()).hexdigest()


def expected_figures(nb):
    """Figures notebook `nb` shows: its `plt.show()` calls (each shows one figure, subplots included)."""
    code = "\n".join(line.split("#", 1)[0] for c in nb["cells"] if c["cell_type"] == "code"
                     for line in "".join(c["source"]).splitlines())
    return len(re.findall(r"\bplt\.show\(\)", code))


# ---------------------------------------------------------------------------------------------
# The browser.

def start_chromium(chromium, chromedriver, profile, driver_log):
    for name, path in (("chromium", chromium), ("chromedriver", chromedriver)):
        if not path or not os.access(path, os.X_OK):
            raise Failed(f"{name} not found ({path or 'not on PATH'}): `ci/install_system.sh --ci` installs "
                         "Debian's chromium and chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in CHROMIUM_ARGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(arg)
    service = Service(executable_path=chromedriver, log_output=str(driver_log))
    try:
        driver = webdriver.Chrome(options=opts, service=service)
    except WebDriverException as e:
        raise Failed(f"headless Chromium did not start ({chromium}, {chromedriver}): {e.msg}; "
                     f"chromedriver's log: {driver_log}") from None
    driver.set_page_load_timeout(UI_TIMEOUT)
    driver.set_script_timeout(UI_TIMEOUT)
    return driver


def _replaced_node(e):
    """True for Chromium's error about an element of a document that a navigation replaced meanwhile
    ("Node with given id does not belong to the document"): a stale element that chromedriver reports
    as an unknown error instead of StaleElementReferenceException."""
    return "does not belong to the document" in (e.msg or "")


def wait_for(driver, what, condition, timeout=UI_TIMEOUT, poll=0.25):
    """The first truthy value of condition(driver) within `timeout` seconds, else Failed(what)."""
    def attempt(d):
        try:
            return condition(d)
        except WebDriverException as e:
            if _replaced_node(e):
                return None  # the page was being replaced: look again
            raise

    try:
        return WebDriverWait(driver, timeout, poll_frequency=poll,
                             ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
                             ).until(attempt)
    except TimeoutException:
        raise Failed(f"{what}: not seen within {timeout:.0f} s (page: {driver.current_url})") from None


def visible(driver, css):
    return [e for e in driver.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]


def dismiss_toasts(driver):
    """Hide notifications (JupyterLab asks about its news feed) so they cover nothing."""
    for button in visible(driver, ".jp-Notification-Toast-Close"):
        try:
            button.click()
        except WebDriverException:
            pass  # a toast that closed on its own meanwhile


def open_menu(driver, title):
    dismiss_toasts(driver)
    item = wait_for(driver, f"the '{title}' menu in the menu bar",
                    lambda d: next((e for e in visible(d, "#jp-MainMenu .lm-MenuBar-item") if e.text.strip() == title),
                                   None))
    item.click()
    return wait_for(driver, f"the '{title}' menu opening", lambda d: visible(d, ".lm-Menu"))


def menu_command(driver, menu, command):
    """Opens menu `menu` and returns its item for JupyterLab command `command` (data-command)."""
    open_menu(driver, menu)
    return wait_for(driver, f"'{command}' enabled in the {menu} menu",
                    lambda d: next(iter(visible(d, f'.lm-Menu li[data-command="{command}"]:not(.lm-mod-disabled)')),
                                   None))


def close_menus(driver):
    for menu in visible(driver, ".lm-Menu"):
        try:
            menu.send_keys(Keys.ESCAPE)  # the menu, not the page, handles its keys
        except (StaleElementReferenceException, WebDriverException):
            pass  # closed with its parent menu
    wait_for(driver, "the menu closing", lambda d: not visible(d, ".lm-Menu"))


def set_autosave(driver, server, on):
    """Sets Settings > Autosave Documents; returns the state it had."""
    item = menu_command(driver, "Settings", "docmanager:toggle-autosave")
    was_on = item.get_attribute("aria-checked") == "true"
    if was_on == on:
        close_menus(driver)
        return was_on
    item.click()
    wait_for(driver, "the Settings menu closing", lambda d: not visible(d, ".lm-Menu"))
    # The lab stores the setting on the server, then the menu shows it.
    wait_for(driver, f"the lab's server storing autosave={on}",
             lambda d: server.json(AUTOSAVE_SETTINGS)["settings"].get("autosave", True) == on, poll=0.5)

    def menu_shows(d):
        shown = menu_command(d, "Settings", "docmanager:toggle-autosave").get_attribute("aria-checked") == "true"
        close_menus(d)
        return shown == on

    wait_for(driver, f"Settings > Autosave Documents shown {'on' if on else 'off'}", menu_shows, poll=0.5)
    return was_on


def listing_names(driver):
    return [e.text.strip() for e in driver.find_elements(By.CSS_SELECTOR, ".jp-DirListing-item .jp-DirListing-itemText")]


def listing_item(driver, name):
    for item in driver.find_elements(By.CSS_SELECTOR, ".jp-DirListing-item"):
        if item.find_element(By.CSS_SELECTOR, ".jp-DirListing-itemText").text.strip() == name:
            return item
    return None


def notebook_state(driver):
    return driver.execute_script(NOTEBOOK_STATE_JS)


def fail_on_dialog(state, doing):
    if state.get("dialog"):
        raise Failed(f"{doing}: JupyterLab opened a dialog: {state['dialog'].strip()[:500]!r}")


# ---------------------------------------------------------------------------------------------
# The checks, in the order a learner meets them.

def check_refused_without_token(driver, server):
    driver.get(server.url + "lab")
    page = wait_for(driver, "the login page or the lab without the token",
                    lambda d: "login" if d.find_elements(By.ID, "password_input")
                    else "lab" if d.find_elements(By.ID, "jp-main-dock-panel") else None)
    if page == "lab":
        raise Failed(f"the lab opened without the token ({driver.current_url}): token authentication is off")
    if "/login" not in driver.current_url:
        raise Failed(f"the login form was served at {driver.current_url}, not at /login")
    # The redirect to /login may still be replacing the document: type into the loaded page's form.
    wait_for(driver, "the login page loading", lambda d: d.execute_script("return document.readyState") == "complete")
    # A wrong token typed into the form is refused too.
    field = driver.find_element(By.ID, "password_input")
    field.send_keys("not-" + server.token)
    driver.find_element(By.ID, "login_submit").click()
    wait_for(driver, "the login form reloading after a wrong token",
             lambda d: not _attached(field) and d.find_elements(By.ID, "password_input"))
    if driver.find_elements(By.ID, "jp-main-dock-panel") or "/login" not in driver.current_url:
        raise Failed(f"a wrong token was accepted ({driver.current_url})")
    for token, what in ((False, "no token"), ("not-" + server.token, "a wrong token")):
        status, _ = server.get("api/contents", token=token)
        if status != 403:
            raise Failed(f"the REST API answered HTTP {status} to {what} (expected 403)")
    log("refused without the token: the login page, also after a wrong token; the API answers 403")


def _attached(element):
    try:
        element.is_enabled()
        return True
    except StaleElementReferenceException:
        return False
    except WebDriverException as e:
        if _replaced_node(e):
            return False
        raise


def check_lab_loads_with_token(driver, server):
    # ?reset: JupyterLab's default layout, whatever an earlier session of this lab left open.
    driver.get(server.url + "lab?reset&token=" + urllib.parse.quote(server.token))
    page = wait_for(driver, "the JupyterLab UI with the token's URL",
                    lambda d: "login" if d.find_elements(By.ID, "password_input")
                    else "lab" if visible(d, "#jp-MainMenu .lm-MenuBar-item") and
                    d.find_elements(By.CSS_SELECTOR, ".jp-DirListing-item") else None)
    if page == "login":
        raise Failed("the token's URL was refused: the login page came back")
    log(f"the token's URL opens the lab: menus {[e.text for e in visible(driver, '#jp-MainMenu .lm-MenuBar-item')]}")


def check_notebook_listing(driver, server):
    listed = server.json(server.api_path(NOTEBOOK_DIR), content="1")
    on_server = sorted(e["name"] for e in listed["content"] if NOTEBOOK_PATTERN.match(e["name"]))
    if [NOTEBOOK_PATTERN.match(n).group(1) for n in on_server] != EXPECTED_PREFIXES:
        raise Failed(f"{NOTEBOOK_DIR}/ on the server holds {on_server}, not one notebook for each of "
                     f"{', '.join(EXPECTED_PREFIXES)}")
    # From the lab's root folder (the home icon of the file browser's path).
    driver.find_element(By.CSS_SELECTOR, ".jp-FileBrowser .jp-BreadCrumbs-home").click()
    folder = wait_for(driver, f"the folder '{NOTEBOOK_DIR}' in the file browser's root folder",
                      lambda d: listing_item(d, NOTEBOOK_DIR))
    ActionChains(driver).double_click(folder).perform()
    wait_for(driver, f"the file browser showing {NOTEBOOK_DIR}/",
             lambda d: NOTEBOOK_DIR in d.find_element(By.CSS_SELECTOR, ".jp-FileBrowser .jp-BreadCrumbs").text
             and any(n.endswith(".ipynb") for n in listing_names(d)))
    shown = [n for n in listing_names(driver) if n.endswith(".ipynb")]
    if shown != on_server:
        raise Failed(f"the file browser lists the notebooks {shown}; expected {on_server} in this order")
    log(f"the file browser lists the six notebooks in order: {', '.join(shown)}")
    return shown[0]


def open_notebook(driver, server, name):
    rel = f"{NOTEBOOK_DIR}/{name}"
    nb = json.loads(server.json(server.api_path(rel), type="file", format="text", content="1")["content"])
    code_cells = sum(c["cell_type"] == "code" for c in nb["cells"])
    figures = expected_figures(nb)
    ActionChains(driver).double_click(listing_item(driver, name)).perform()
    wait_for(driver, f"{name} opening in a tab",
             lambda d: any(t.text.strip() == name for t in
                           d.find_elements(By.CSS_SELECTOR, "#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current "
                                                            ".lm-TabBar-tabLabel")))

    def ready(d):
        state = notebook_state(d)
        fail_on_dialog(state, f"opening {name}")
        return state if state["found"] and len(state["prompts"]) == code_cells and state["kernel"] == "idle" else None

    state = wait_for(driver, f"{name} showing its {code_cells} code cells with an idle kernel", ready)
    if any(p != "[ ]:" for p in state["prompts"]):
        raise Failed(f"{name} opened with outputs or execution counts ({state['prompts']}): it should be committed "
                     "without outputs")
    log(f"opened {rel}: {code_cells} code cells, kernel idle, {figures} figures expected")
    return code_cells, figures


def run_all_cells(driver, name, code_cells, timeout):
    # Run > Restart Kernel and Run All Cells: a fresh kernel whatever ran in this lab before, so
    # the cells must come back numbered 1..N.
    menu_command(driver, "Run", "runmenu:restart-and-run-all").click()
    dialog = wait_for(driver, "the 'Restart Kernel?' dialog", lambda d: next(iter(visible(d, ".jp-Dialog")), None))
    if "restart" not in dialog.find_element(By.CSS_SELECTOR, ".jp-Dialog-header").text.lower():
        raise Failed(f"unexpected dialog after Restart Kernel and Run All Cells: {dialog.text[:300]!r}")
    dialog.find_element(By.CSS_SELECTOR, ".jp-Dialog-footer button.jp-mod-accept").click()
    wait_for(driver, "the 'Restart Kernel?' dialog closing", lambda d: not visible(d, ".jp-Dialog"))
    t0 = time.monotonic()
    last_report, stopped_since = t0, None

    def progress(state):
        return sum(bool(re.fullmatch(r"\[\d+\]:", p or "")) for p in state["prompts"])

    def finished(d):
        nonlocal last_report, stopped_since
        state = notebook_state(d)
        fail_on_dialog(state, f"running {name}")
        done = progress(state)
        now = time.monotonic()
        if now - last_report >= 30:
            log(f"  {done}/{code_cells} code cells executed after {now - t0:.0f} s (kernel {state['kernel']})")
            last_report = now
        if state["kernel"] == "dead":  # ("unknown" and "restarting" pass while the kernel restarts)
            raise Failed(f"the kernel of {name} is {state['kernel']} after {done}/{code_cells} cells")
        if state["errors"] and state["kernel"] == "idle":
            e = state["errors"][0]
            raise Failed(f"code cell {e['cell'] + 1} of {name} shows an error:\n{e['text'].strip()}")
        idle_stopped = state["kernel"] == "idle" and "[*]:" not in state["prompts"] and done < code_cells
        if idle_stopped and done > 0:
            # The run stops at a failing cell and leaves the rest without a count: give the DOM
            # a few polls to settle before calling it.
            stopped_since = stopped_since or now
            if now - stopped_since > 10:
                first = next(i for i, p in enumerate(state["prompts"]) if not re.fullmatch(r"\[\d+\]:", p or ""))
                raise Failed(f"the run of {name} stopped: the kernel is idle and code cell {first + 1} "
                             f"(of {code_cells}) was not executed; prompts {state['prompts']}")
        else:
            stopped_since = None
        return state if done == code_cells and state["kernel"] == "idle" else None

    state = wait_for(driver, f"all {code_cells} code cells of {name} executed with the kernel idle", finished,
                     timeout=timeout, poll=1.0)
    counts = [int(p[1:-2]) for p in state["prompts"]]
    if counts != list(range(1, code_cells + 1)):
        raise Failed(f"the cells of {name} were not executed once each, in order, by a fresh kernel: "
                     f"{state['prompts']}")
    log(f"ran all {code_cells} code cells of {name} through Run > Restart Kernel and Run All Cells in "
        f"{time.monotonic() - t0:.0f} s: numbered 1..{code_cells}, kernel idle")
    return state


def check_outputs(driver, name, figures):
    def rendered(d):
        state = notebook_state(d)
        return state if state["images"] >= figures and state["images_rendered"] == state["images"] else None

    try:
        state = wait_for(driver, f"{figures} rendered figures", rendered, timeout=60)
    except Failed:
        state = notebook_state(driver)
        raise Failed(f"{name} shows {state['images_rendered']} rendered images ({state['images']} img elements) in "
                     f"its output areas; its code shows {figures} figures (plt.show() calls)") from None
    if state["errors"]:
        e = state["errors"][0]
        raise Failed(f"code cell {e['cell'] + 1} of {name} shows an error:\n{e['text'].strip()}")
    if state["images"] != figures:
        raise Failed(f"{name} shows {state['images']} images in its output areas; its code shows {figures} "
                     "figures (plt.show() calls)")
    log(f"{name}: no error output, {state['images']} figures rendered as images in the output areas")
    if state["stderr"]:
        log(f"{name}: {len(state['stderr'])} stderr outputs (log text, not errors), in code cells "
            f"{sorted({s['cell'] + 1 for s in state['stderr']})}")


def screenshot_executed(driver, path):
    dismiss_toasts(driver)
    # The last figure in view, below the notebook's toolbar (kernel idle). The notebook lays out
    # cells as they come into view (their heights change), so scroll until the figure stays put.
    last = {}

    def figure_in_view(d):
        rect = d.execute_script("""
            const imgs = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output img');
            const img = imgs[imgs.length - 1];
            let r = img.getBoundingClientRect();
            if (r.top < 0 || r.bottom > window.innerHeight) {
              img.scrollIntoView({block: 'end'});
              r = img.getBoundingClientRect();
            }
            return [Math.round(r.top), Math.round(r.bottom), window.innerHeight];""")
        stable = rect == last.get("rect")
        last["rect"] = rect
        return stable and 0 <= rect[0] and rect[1] <= rect[2]

    wait_for(driver, "the last figure scrolled into view and its position settled", figure_in_view, poll=0.5)
    save_screenshot(driver, path)
    log(f"screenshot of the lab with the executed notebook: {path}")


def close_without_saving(driver, server, rel, name):
    menu_command(driver, "File", "filemenu:close-and-cleanup").click()
    # JupyterLab asks to confirm the shutdown, then (the notebook has unsaved outputs) whether to
    # save: confirm the first, answer "Discard" to the second, never "Save".
    deadline = time.monotonic() + UI_TIMEOUT
    while True:
        tab_open = any(t.text.strip() == name for t in
                       driver.find_elements(By.CSS_SELECTOR, "#jp-main-dock-panel .lm-TabBar-tabLabel"))
        dialogs = visible(driver, ".jp-Dialog")
        if not tab_open and not dialogs:
            break
        if time.monotonic() > deadline:
            raise Failed(f"{name} did not close within {UI_TIMEOUT} s (dialog: "
                         f"{dialogs[0].text[:300] if dialogs else None!r})")
        if dialogs:
            buttons = {b.text.strip(): b for b in dialogs[0].find_elements(By.CSS_SELECTOR, ".jp-Dialog-footer button")}
            title = dialogs[0].find_element(By.CSS_SELECTOR, ".jp-Dialog-header").text.strip()
            if "Discard" in buttons:
                buttons["Discard"].click()
            elif title.lower().startswith("shut down") and "Save" not in buttons:
                dialogs[0].find_element(By.CSS_SELECTOR, ".jp-Dialog-footer button.jp-mod-accept").click()
            else:
                raise Failed(f"unexpected dialog while closing {name}: {dialogs[0].text[:300]!r} "
                             f"(buttons {list(buttons)})")
            wait_for(driver, "the dialog closing", lambda d, dlg=dialogs[0]: not _attached(dlg) or not dlg.is_displayed())
        else:
            wait_for(driver, f"{name} closing or a dialog", lambda d: visible(d, ".jp-Dialog") or not any(
                t.text.strip() == name for t in d.find_elements(By.CSS_SELECTOR, "#jp-main-dock-panel .lm-TabBar-tabLabel")))
    wait_for(driver, f"the kernel session of {rel} shutting down",
             lambda d: not any(s.get("path") == rel for s in server.json("api/sessions")))
    log(f"closed {name} without saving (Discard) and shut its kernel down")


def save_screenshot(driver, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    if not driver.save_screenshot(str(path)):
        raise Failed(f"Chromium could not write the screenshot {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the lab's base URL, e.g. http://127.0.0.1:8888/")
    ap.add_argument("--token", required=True, help="the lab's token (printed by `make lab` as ?token=...)")
    ap.add_argument("--screenshot", required=True, type=Path, help="PNG to write (its folder is created)")
    ap.add_argument("--timeout", type=float, default=900,
                    help="seconds allowed for running notebook 01's cells (default 900: a loaded 2-core machine)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--chromedriver", default=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    args = ap.parse_args(argv)
    if not re.match(r"^https?://[^/]+", args.url):
        ap.error(f"--url {args.url!r} is not an http(s) URL")
    if not args.token.strip():
        ap.error("--token is empty")
    if args.timeout <= 0:
        ap.error("--timeout must be positive")
    if args.screenshot.suffix.lower() != ".png":
        ap.error(f"--screenshot {args.screenshot} must end in .png")

    # Stopped with SIGTERM (a CI timeout, ci/lab_test.sh's cleanup): unwind, so that Chromium is closed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = Server(args.url, args.token)
    args.screenshot.unlink(missing_ok=True)  # never leave an older run's picture under this name
    work = Path(tempfile.mkdtemp(prefix="lab-browser-test-"))
    driver, t0 = None, time.monotonic()
    autosave_was_on, rel, before = None, None, None
    try:
        status, _ = server.get("api", token=False)
        if status != 200:
            raise Failed(f"{server.url}api answered HTTP {status}: is a Jupyter server running there?")
        driver = start_chromium(args.chromium, args.chromedriver, work / "profile", work / "chromedriver.log")
        check_refused_without_token(driver, server)
        check_lab_loads_with_token(driver, server)
        autosave_was_on = set_autosave(driver, server, False)
        log(f"Settings > Autosave Documents turned off (it was {'on' if autosave_was_on else 'off'}): "
            "running the notebook must not write its outputs into the file")
        name = check_notebook_listing(driver, server)
        rel = f"{NOTEBOOK_DIR}/{name}"
        before = server.file_state(rel)
        code_cells, figures = open_notebook(driver, server, name)
        run_all_cells(driver, name, code_cells, args.timeout)
        check_outputs(driver, name, figures)
        screenshot_executed(driver, args.screenshot)
        close_without_saving(driver, server, rel, name)
        if autosave_was_on:
            set_autosave(driver, server, True)
            autosave_was_on = False
            log("Settings > Autosave Documents turned back on")
        after = server.file_state(rel)
        if after != before:
            raise Failed(f"{rel} was modified on the server during the test (last modified {before[0]} -> "
                         f"{after[0]})")
        log(f"{rel} is unchanged on the server (same text, last modified {after[0]})")
    except (Failed, WebDriverException) as e:
        msg = str(e) if isinstance(e, Failed) else f"the browser failed: {e.msg or e!r}"
        if driver is not None:
            try:
                save_screenshot(driver, args.screenshot)
                msg += f"\nscreenshot of the failure: {args.screenshot}"
            except (Failed, WebDriverException) as shot:
                msg += f"\n(no screenshot: {shot})"
        if rel and before:
            try:
                if server.file_state(rel) != before:
                    msg += f"\n{rel} was modified on the server"
            except Failed:
                pass
        if autosave_was_on:
            msg += "\nSettings > Autosave Documents is left off in this lab's settings"
        print(f"lab_browser_test: FAILED after {time.monotonic() - t0:.0f} s: {msg}", file=sys.stderr, flush=True)
        return 1
    finally:
        if driver is not None:
            try:
                driver.quit()
            except WebDriverException:
                pass
        shutil.rmtree(work, ignore_errors=True)
    log(f"passed in {time.monotonic() - t0:.0f} s; screenshot: {args.screenshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
