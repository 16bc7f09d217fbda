"""Check every internal link of the built documentation site, with no network.

Parses each HTML file under the site folder (default build/docs) and checks that every relative `href` and `src`
names a file that exists, and that every `#anchor` (on the same page or another) is an `id` (or `<a name>`) of
the page it points to. External links (http:, https:, mailto:, ...) are not followed. Exits 1 and lists each
broken link as `page: link (why)`.

    python ci/check_docs_links.py [build/docs]
"""
from __future__ import annotations

import argparse
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    """The ids (anchors) a page defines and the relative links it holds."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) is not None and tag in ("a", "link", "img", "script", "iframe", "source"):
                self.links.append(a[key])


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def check(site: Path) -> list[str]:
    """Return one line per broken internal link of the HTML files under `site` (empty when all resolve).

    Args:
        site: the folder of the built site (its index.html at the top).

    Returns:
        `"page: link (why)"` strings, pages relative to `site`.

    Raises:
        FileNotFoundError: `site` holds no index.html.

    Example:
        >>> check(Path("build/docs"))  # doctest: +SKIP
        []
    """
    if not (site / "index.html").is_file():
        raise FileNotFoundError(f"no index.html in site folder {site}: build it with `make docs`")
    pages = {p.resolve(): _parse(p) for p in site.rglob("*.html")}
    broken = []
    for path, page in sorted(pages.items()):
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("//"):
                continue  # external: not checked (no network)
            target = path if not parts.path else (path.parent / unquote(parts.path)).resolve()
            where = f"{path.relative_to(site.resolve())}: {link}"
            if parts.path and target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{where} (no file {target})")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{where} (no anchor #{parts.fragment} in {target.name})")
    return broken


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", nargs="?", type=Path, default=Path("build/docs"), help="built site (default build/docs)")
    a = ap.parse_args(argv)
    broken = check(a.site)
    n_pages = sum(1 for _ in a.site.rglob("*.html"))
    for line in broken:
        print(line)
    print(f"checked the internal links of {n_pages} pages in {a.site}: {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
