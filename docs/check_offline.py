"""Check that built HTML documentation loads no asset from another site.

Usage::

    python docs/check_offline.py docs/_build/html

Every ``.html`` file under the folder is parsed (``html.parser``) and every ``.css`` file
scanned. An *asset* reference is one the browser fetches by itself when the page is shown:
``src`` of ``script``/``img``/``iframe``/``source``/``audio``/``video``/``track``/``embed``/
``input``, ``srcset``, ``data`` of ``object``, ``poster``, ``href`` of ``link`` (stylesheets,
icons, preloads, manifests), and ``url(...)`` / ``@import`` in ``style`` attributes,
``<style>`` blocks and CSS files. An asset is external when its URL has a scheme and host
(``http://``, ``https://``, or protocol-relative ``//``). Plain hyperlinks (``<a href>``),
which a reader follows on purpose, are allowed. Also checked: a page with maths must load
a MathJax script that exists in the build.

Exit status 0 when nothing external is referenced, 1 otherwise (one line per finding).
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

EXTERNAL = re.compile(r"^\s*(?:[a-zA-Z][a-zA-Z0-9+.-]*:)?//", re.ASCII)
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""", re.IGNORECASE)
SRC_TAGS = {"script", "img", "iframe", "source", "audio", "video", "track", "embed", "input", "frame"}


def _external(url: str) -> bool:
    return bool(EXTERNAL.match(url or ""))


def css_findings(css: str):
    return [u for m in CSS_URL.finditer(css) for u in m.groups() if u and _external(u)]


class _Scanner(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.findings: list[str] = []
        self.scripts: list[str] = []
        self.has_math = False
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = {k.lower(): (v or "") for k, v in attrs}
        refs = []
        if tag in SRC_TAGS and "src" in a:
            refs.append(("src", a["src"]))
        if tag == "script" and "src" in a:
            self.scripts.append(a["src"])
        if tag == "link" and "href" in a:
            refs.append(("href", a["href"]))
        if tag == "object" and "data" in a:
            refs.append(("data", a["data"]))
        if "poster" in a:
            refs.append(("poster", a["poster"]))
        for key in ("srcset", "imagesrcset"):
            if key in a:
                refs += [(key, part.strip().split(" ")[0]) for part in a[key].split(",") if part.strip()]
        for key, url in refs:
            if _external(url):
                self.findings.append(f"<{tag} {key}={url!r}>")
        if "style" in a:
            self.findings += [f"<{tag} style=url({u!r})>" for u in css_findings(a["style"])]
        cls = a.get("class", "").split()
        if "math" in cls or "math" in a.get("type", "") or tag == "math":
            self.has_math = True
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.findings += [f"<style> url({u!r})" for u in css_findings(data)]
        if "\\(" in data or "\\[" in data:
            self.has_math = True


def scan_html(text: str):
    """``(findings, script srcs, has_math)`` of one HTML page."""
    s = _Scanner()
    s.feed(text)
    s.close()
    return s.findings, s.scripts, s.has_math


def check(root: Path) -> list[str]:
    root = Path(root)
    pages = sorted(root.rglob("*.html"))
    if not pages:
        return [f"{root}: no HTML pages (was the documentation built?)"]
    problems = []
    for page in pages:
        findings, scripts, has_math = scan_html(page.read_text(encoding="utf-8", errors="replace"))
        rel = page.relative_to(root).as_posix()
        problems += [f"{rel}: external asset {f}" for f in findings]
        if has_math:
            mj = [s for s in scripts if "mathjax" in s.lower()]
            if not mj:
                problems.append(f"{rel}: maths but no MathJax script")
            for s in mj:
                if not _external(s) and not (page.parent / s.split("?")[0]).is_file():
                    problems.append(f"{rel}: MathJax script {s!r} is not in the build")
    for css in sorted(root.rglob("*.css")):
        problems += [
            f"{css.relative_to(root).as_posix()}: external asset url({u!r})"
            for u in css_findings(css.read_text(encoding="utf-8", errors="replace"))
        ]
    return problems


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__)
        return 2
    problems = check(Path(argv[0]))
    for p in problems:
        print(p)
    n = len(list(Path(argv[0]).rglob("*.html")))
    print(f"{n} pages checked: {len(problems)} external asset reference(s)" if n else "")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
