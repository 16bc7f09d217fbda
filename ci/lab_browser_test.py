"""What a learner sees in the lab, checked with headless Chromium through Selenium.

    python ci/lab_browser_test.py --url http://127.0.0.1:PORT/ --token TOKEN \\
        --screenshot build/lab/NAME.png [--timeout S]

It drives a running JupyterLab (however it was started: `make lab`, a Docker container) the way
a learner does, and stops at the first thing that is wrong, with a message naming it:

1. without the token the lab is refused: the login page, also after a wrong token;
2. with the token's URL the JupyterLab UI loads, and its first view (the file browser, before any
   click) shows the lab's working copies of the notebooks (the folder the server names as its
   preferred one, e.g. build/lab/notebooks): the six notebooks 01_ ... 06_ in order, 01 first,
   the same names as the lesson sources in notebooks/;
3. a save into notebooks/ (the lesson sources) is refused by the server (HTTP 403): a probe file
   that must not be written there (it is deleted, and the test fails, if it was);
4. notebook 02 opened from the file browser, its kernel started and idle, is not marked modified
   (its tab has no dirty mark), and it closes without asking to be saved;
5. notebook 01 opened the same way is not marked modified either; run with the Run menu's
   "Restart Kernel and Run All Cells" it finishes: every code cell gets its execution count
   (1..N, in order), the kernel goes idle, no cell shows an error, and the output areas hold one
   rendered image per figure the notebook shows (`plt.show()`);
6. a screenshot of the lab with notebook 01 executed is saved (and its path printed); on a failure
   the screenshot shows the failure instead;
7. File > Save Notebook saves it: the tab's dirty mark goes, the working copy on the server holds
   the outputs (execution counts 1..N, the figures), and the notebook closes without a question;
8. every lesson source in notebooks/ has the same text and modification time as before the test
   (read through the REST API: for `make lab` and for the lab in a container alike);
9. the documentation site that `make docs` built (--docs, default build/docs) opens from file://: its
   index page and the API page of `embedlab.ops`, each with its title and heading. Where the folder
   holds no index.html the step is skipped and says so (`make docs` builds it).

Notebook 01 runs at the scale of the lab's environment: start the lab with EMBEDLAB_SCALE=ci
(ci/lab_test.sh and ci/docker_test.sh do). Autosave stays on, as a learner has it: the lab itself
keeps the sources unchanged. The REST API is only read (what the server lists, the files' text,
the sessions), except for the probe of step 3; everything that runs code goes through the UI.

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

SOURCE_DIR = "notebooks"  # the lesson sources (tracked by git), relative to the lab's root folder
NOTEBOOK_PATTERN = re.compile(r"^(\d\d)_[A-Za-z0-9_]+\.ipynb$")
EXPECTED_PREFIXES = ["01", "02", "03", "04", "05", "06"]
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


# JupyterLab marks a document's tab with jp-mod-dirty while it has unsaved changes.
TAB_DIRTY_JS = r"""
const tabs = [...document.querySelectorAll('#jp-main-dock-panel .lm-TabBar-tab')]
  .filter(t => (t.querySelector('.lm-TabBar-tabLabel') || {}).textContent?.trim() === arguments[0]);
return tabs.map(t => t.classList.contains('jp-mod-dirty'));
"""


def tab_dirty(driver, name):
    """True/False: whether the tab of `name` is marked modified; None when no tab of that name is open."""
    marks = driver.execute_script(TAB_DIRTY_JS, name)
    return marks[0] if marks else None


def notebook_names(server, folder):
    """The NN_*.ipynb names the server lists in `folder`, sorted; Failed unless one for each of 01..06."""
    listed = server.json(server.api_path(folder), content="1")
    names = sorted(e["name"] for e in listed["content"] if e["type"] == "notebook" and NOTEBOOK_PATTERN.match(e["name"]))
    if [NOTEBOOK_PATTERN.match(n).group(1) for n in names] != EXPECTED_PREFIXES:
        raise Failed(f"{folder}/ on the server holds {names}, not one notebook for each of {', '.join(EXPECTED_PREFIXES)}")
    return names


def check_first_view(driver, server):
    """The file browser of the freshly loaded lab shows the working copies, 01 first; returns (folder, names)."""
    folder = driver.execute_script(
        "const e = document.getElementById('jupyter-config-data');"
        "return e ? (JSON.parse(e.textContent).preferredPath || '') : null;")
    folder = (folder or "").strip("/")
    if not folder or folder == SOURCE_DIR:
        raise Failed(f"the lab's preferred folder (where its file browser opens) is {folder or 'the root folder'!r}: "
                     f"it should be the working copies of the notebooks, outside {SOURCE_DIR}/")
    names = notebook_names(server, folder)
    sources = notebook_names(server, SOURCE_DIR)
    if names != sources:
        raise Failed(f"the working copies in {folder}/ are {names}; the lesson sources in {SOURCE_DIR}/ are {sources}")
    # Before any click: the breadcrumbs name the folder and the listing holds the notebooks.
    last = folder.rsplit("/", 1)[-1]
    wait_for(driver, f"the lab's first view showing {folder}/ in the file browser",
             lambda d: last in d.find_element(By.CSS_SELECTOR, ".jp-FileBrowser .jp-BreadCrumbs").text
             and any(n.endswith(".ipynb") for n in listing_names(d)))
    shown = listing_names(driver)
    notebooks = [n for n in shown if n.endswith(".ipynb")]
    if notebooks != names or shown[0] != names[0]:
        raise Failed(f"the lab's first view lists {shown}; expected the notebooks {names} in this order, "
                     f"{names[0]} first")
    log(f"the lab's first view is {folder}/ (the working copies): {', '.join(notebooks)}; "
        f"the same names as {SOURCE_DIR}/")
    return folder, names


def check_sources_refuse_saves(server):
    """A save into the lesson sources' folder is refused: a new file there must get HTTP 403."""
    probe = f"{SOURCE_DIR}/zz-lab-test-probe-{os.getpid()}.txt"
    url = urllib.parse.urljoin(server.url, server.api_path(probe))
    body = json.dumps({"type": "file", "format": "text", "content": "must not be written"}).encode()
    req = urllib.request.Request(url, data=body, method="PUT",
                                 headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, answer = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, answer = e.code, e.read()
    if status != 403:
        if status in (200, 201):
            urllib.request.urlopen(urllib.request.Request(url, method="DELETE",
                                                          headers={"Authorization": f"token {server.token}"}),
                                   timeout=30).close()
        raise Failed(f"a save into {SOURCE_DIR}/ answered HTTP {status} (expected 403: the lab never changes the "
                     f"lesson sources): {answer[:300]!r}")
    message = json.loads(answer).get("message", "")
    log(f"a save into {SOURCE_DIR}/ is refused (HTTP 403: {message[:120]!r}...)")


def sources_state(server, names):
    return {n: server.file_state(f"{SOURCE_DIR}/{n}") for n in names}


def check_not_dirty(driver, name, settle=5.0):
    """`name`'s tab stays unmarked for `settle` seconds after its kernel went idle (the kernel's info
    reply updates the notebook's metadata just after it connects)."""
    t_end = time.monotonic() + settle
    while time.monotonic() < t_end:
        dirty = tab_dirty(driver, name)
        if dirty is None:
            raise Failed(f"no tab of {name} is open")
        if dirty:
            raise Failed(f"{name} is marked modified (its tab is dirty) although nothing was changed: its metadata "
                         "(kernelspec, language_info) differs from what the kernel reports (ci/normalize_notebooks.py)")
        time.sleep(0.25)


def open_notebook(driver, server, folder, name):
    """Opens `name` from the file browser (showing `folder`); returns (code cells, figures)."""
    rel = f"{folder}/{name}"
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
    check_not_dirty(driver, name)
    log(f"opened {rel}: {code_cells} code cells, kernel idle, not marked modified; {figures} figures expected")
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


def save_notebook(driver, server, rel, name, code_cells, figures):
    """File > Save Notebook: the tab loses its dirty mark and the file on the server holds the run."""
    before = server.file_state(rel)
    menu_command(driver, "File", "docmanager:save").click()
    wait_for(driver, f"{name} saved (its tab no longer marked modified)", lambda d: tab_dirty(d, name) is False)
    wait_for(driver, f"{rel} written on the server", lambda d: server.file_state(rel) != before, poll=0.5)
    nb = json.loads(server.json(server.api_path(rel), type="file", format="text", content="1")["content"])
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c.get("execution_count") for c in code]
    images = sum("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", []))
    if counts != list(range(1, code_cells + 1)) or images < figures:
        raise Failed(f"the saved {rel} holds execution counts {counts} and {images} figures; expected 1..{code_cells} "
                     f"and {figures}: the learner's outputs were not kept")
    log(f"saved {rel} with File > Save Notebook: its outputs are in the file (counts 1..{code_cells}, {images} figures)")


def close_notebook(driver, server, rel, name):
    """File > Close and Shut Down Notebook; fails if JupyterLab asks whether to save (it has no unsaved changes)."""
    menu_command(driver, "File", "filemenu:close-and-cleanup").click()
    # JupyterLab asks to confirm the kernel's shutdown: confirm. A question about saving means the
    # notebook was marked modified.
    deadline = time.monotonic() + UI_TIMEOUT
    while True:
        tab_open = tab_dirty(driver, name) is not None
        dialogs = visible(driver, ".jp-Dialog")
        if not tab_open and not dialogs:
            break
        if time.monotonic() > deadline:
            raise Failed(f"{name} did not close within {UI_TIMEOUT} s (dialog: "
                         f"{dialogs[0].text[:300] if dialogs else None!r})")
        if dialogs:
            buttons = {b.text.strip(): b for b in dialogs[0].find_elements(By.CSS_SELECTOR, ".jp-Dialog-footer button")}
            title = dialogs[0].find_element(By.CSS_SELECTOR, ".jp-Dialog-header").text.strip()
            if title.lower().startswith("shut down") and "Save" not in buttons and "Discard" not in buttons:
                dialogs[0].find_element(By.CSS_SELECTOR, ".jp-Dialog-footer button.jp-mod-accept").click()
            else:
                raise Failed(f"closing {name}, which has no unsaved changes, JupyterLab asked: "
                             f"{dialogs[0].text[:300]!r} (buttons {list(buttons)})")
            wait_for(driver, "the dialog closing", lambda d, dlg=dialogs[0]: not _attached(dlg) or not dlg.is_displayed())
        else:
            wait_for(driver, f"{name} closing or a dialog",
                     lambda d: visible(d, ".jp-Dialog") or tab_dirty(d, name) is None)
    wait_for(driver, f"the kernel session of {rel} shutting down",
             lambda d: not any(s.get("path") == rel for s in server.json("api/sessions")))
    log(f"closed {name} without a question about saving, and shut its kernel down")


DOCS_PAGES = [  # (page under the site, what its <title> starts with, its first <h1>)
    ("index.html", "EmbedLab", "EmbedLab"),
    ("api/generated/embedlab.ops.html", "embedlab.ops", "embedlab.ops"),
]


def check_docs(driver, site: Path):
    """Open the built documentation's index and one API page from file:// and check their titles and headings."""
    if not (site / "index.html").is_file():
        log(f"no {site / 'index.html'}: the documentation check is skipped (`make docs` builds the site)")
        return
    for page, title, heading in DOCS_PAGES:
        path = site / page
        if not path.is_file():
            raise Failed(f"the documentation site {site} has no {page}")
        driver.get(path.resolve().as_uri())
        wait_for(driver, f"{page} to load", lambda d: d.execute_script("return document.readyState") == "complete")
        h1 = driver.find_elements(By.CSS_SELECTOR, "h1")
        got_h1 = h1[0].text.strip().rstrip("#¶").strip() if h1 else None
        if not driver.title.startswith(title) or got_h1 != heading:
            raise Failed(f"documentation page {page}: title {driver.title!r}, heading {got_h1!r}; expected the "
                         f"title to start with {title!r} and the heading {heading!r}")
        log(f"documentation page {page}: title {driver.title!r}, heading {got_h1!r}")


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
    ap.add_argument("--docs", type=Path, default=Path("build/docs"),
                    help="the built documentation site to open after the lab's checks (default build/docs)")
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
    sources, before = None, None
    try:
        status, _ = server.get("api", token=False)
        if status != 200:
            raise Failed(f"{server.url}api answered HTTP {status}: is a Jupyter server running there?")
        driver = start_chromium(args.chromium, args.chromedriver, work / "profile", work / "chromedriver.log")
        check_refused_without_token(driver, server)
        check_lab_loads_with_token(driver, server)
        folder, names = check_first_view(driver, server)
        sources = list(names)
        before = sources_state(server, sources)
        check_sources_refuse_saves(server)
        # A notebook opened and closed unchanged: no dirty mark, no question about saving.
        open_notebook(driver, server, folder, names[1])
        close_notebook(driver, server, f"{folder}/{names[1]}", names[1])
        name = names[0]
        rel = f"{folder}/{name}"
        code_cells, figures = open_notebook(driver, server, folder, name)
        run_all_cells(driver, name, code_cells, args.timeout)
        check_outputs(driver, name, figures)
        screenshot_executed(driver, args.screenshot)
        save_notebook(driver, server, rel, name, code_cells, figures)
        close_notebook(driver, server, rel, name)
        after = sources_state(server, sources)
        changed = [n for n in sources if after[n] != before[n]]
        if changed:
            raise Failed(f"the lesson sources {changed} in {SOURCE_DIR}/ were modified on the server during the test")
        log(f"the lesson sources in {SOURCE_DIR}/ are unchanged on the server (same text and modification times)")
        check_docs(driver, args.docs)
    except (Failed, WebDriverException) as e:
        msg = str(e) if isinstance(e, Failed) else f"the browser failed: {e.msg or e!r}"
        if driver is not None:
            try:
                save_screenshot(driver, args.screenshot)
                msg += f"\nscreenshot of the failure: {args.screenshot}"
            except (Failed, WebDriverException) as shot:
                msg += f"\n(no screenshot: {shot})"
        if sources and before:
            try:
                changed = [n for n, state in sources_state(server, sources).items() if state != before[n]]
                if changed:
                    msg += f"\nthe lesson sources {changed} in {SOURCE_DIR}/ were modified on the server"
            except Failed:
                pass
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
