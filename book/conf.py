"""Sphinx configuration of the course's web book (``make book``; see book/build.py).

The book is built from the notebooks as committed, with their stored outputs: nothing is
executed, and nothing is downloaded (the theme and MathJax come from PyPI packages).
"""

from __future__ import annotations

import html
import os
import re
import shutil
from pathlib import Path

# ----------------------------------------------------------------- the one setting to edit
# The course's public repository. The book's "Open in Colab" links, the install line for
# Colab, the repository and Colab buttons, the notebook downloads and the footer's link are
# all built from it. Where it comes from, first found first:
#   1. MHA_REPOSITORY_URL (one build: `MHA_REPOSITORY_URL=https://github.com/me/course make book`);
#   2. GITHUB_REPOSITORY (+ GITHUB_SERVER_URL), which GitHub Actions sets in every workflow, so
#      that the book built by CI and published by .github/workflows/pages.yml points at the
#      repository it was built from, with nothing to edit;
#   3. REPOSITORY_URL below: set it once the course has a public home.
# While it is still the placeholder, the book is built without those links, and
# `python book/build.py` says so loudly (with --require-repository, or
# MHA_REQUIRE_REPOSITORY=1, it refuses to build instead: pages.yml does that).
PLACEHOLDER_URL = "https://github.com/OWNER/REPO"
REPOSITORY_URL = PLACEHOLDER_URL
REPOSITORY_BRANCH = "main"


def _repository() -> tuple[str, str]:
    """The repository's URL and where it came from."""
    if os.environ.get("MHA_REPOSITORY_URL", "").strip():
        return os.environ["MHA_REPOSITORY_URL"].strip(), "MHA_REPOSITORY_URL"
    if os.environ.get("GITHUB_REPOSITORY", "").strip():
        server = os.environ.get("GITHUB_SERVER_URL", "").strip() or "https://github.com"
        return f"{server.rstrip('/')}/{os.environ['GITHUB_REPOSITORY'].strip()}", "GITHUB_REPOSITORY"
    return REPOSITORY_URL, "REPOSITORY_URL in book/conf.py"


repository_url, repository_source = _repository()
repository_url = repository_url.rstrip("/").removesuffix(".git")
repository_branch = os.environ.get("MHA_REPOSITORY_BRANCH", "").strip() or REPOSITORY_BRANCH
# A real repository: an http(s) URL with an owner and a name, not the placeholder.
repository_configured = bool(re.fullmatch(r"https?://[^/\s]+/[^/\s]+/[^/\s]+", repository_url)) and not (
    repository_url == PLACEHOLDER_URL or "/OWNER/" in repository_url or repository_url.endswith("/REPO"))
if not repository_configured:
    repository_url = ""
github = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+)", repository_url)

# JupyterLab's address as `make lab` starts it (HOST and PORT in the Makefile); the pages say
# to use the address `make lab` printed when it differs. MHA_LAB_URL changes it for one build.
lab_url = (os.environ.get("MHA_LAB_URL", "").strip() or "http://127.0.0.1:8888").rstrip("/")

# ------------------------------------------------------------------------------ Sphinx
project = "Multi-head attention, from one dot product to the full module"
author = "the course's contributors"
copyright = "the course's contributors; MIT licence"  # noqa: A001 - Sphinx's name

extensions = [
    "myst_nb",  # notebooks and MyST markdown
    "sphinx.ext.githubpages",  # .nojekyll, for GitHub Pages
    "sphinx_copybutton",  # a copy button on the code (below)
]
# Copy buttons on the code, always: sphinx-copybutton (pinned in requirements-dev.txt, which
# `make setup`, `make book` and the workflows install). Its script and stylesheet are shipped
# in the book's _static/, like the rest; _prune drops what its pages do not load.
try:
    import sphinx_copybutton  # noqa: F401
except ImportError as error:
    raise ImportError(
        "the web book needs sphinx-copybutton (copy buttons on the code), which is not installed: "
        "run `make setup` (or `pip install -r requirements-dev.txt`, which pins it)") from error
# Only the code: the notebooks' code cells and the bash and Python blocks, not the outputs,
# nor the prompts ($, >>>) or printed output of a shell or console example.
copybutton_selector = "div.cell_input pre, div.highlight-bash pre, div.highlight-python pre"
copybutton_exclude = ".linenos, .gp, .go"

# The notebooks as committed: their stored outputs, never re-executed.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "conf.py", "build.py", "*.py"]
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["course.css"]
# course.js: the visible sidebar buttons work (the theme wires hidden copies), long lines wrap,
# figures zoom, search excerpts come from the page's text.
html_js_files = ["course.js"]

# MathJax 3 from the sphinx-mathjax-offline package, but only what the pages load: the one
# bundle (TeX in, CommonHTML out) and its fonts, copied by _ship_mathjax below (the
# package's own extension would copy all of its 24 MB).
mathjax_path = "mathjax/tex-chtml.js"
MATHJAX_FILES = ["tex-chtml.js", "output/chtml/fonts/woff-v2"]

html_theme = "sphinx_book_theme"
html_title = "Multi-head attention"
html_copy_source = False  # the notebooks are in the repository; no _sources/ copies
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "repository_url": repository_url,
    "repository_branch": repository_branch,
    "path_to_docs": "",
    "use_repository_button": repository_configured,
    # The download menu: the notebook (the committed file, from the repository: see
    # _download_notebook) and "print to PDF".
    "use_download_button": True,
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "navigation_with_keys": False,
    # The footer: what the course is and where it lives, not a placeholder author.
    "footer_content_items": ["extra-footer.html"],
    "extra_footer": (
        "<p>Multi-head attention: an open course, its text and code under the MIT licence"
        + (f' · <a href="{html.escape(repository_url)}">source, issues and contributors</a>'
           if repository_configured else "")
        + " · built from the notebooks as committed.</p>"
    ),
}
if github:
    # The theme's rocket menu on notebook pages: open this notebook in Colab.
    html_theme_options["launch_buttons"] = {"colab_url": "https://colab.research.google.com"}

# default_mode: the theme's light/dark switch starts on the reader's system setting (without
# it, the theme logs an error to the console on a first visit).
html_context = {"default_mode": "auto"}
html_favicon = "_static/favicon.svg"

# Offline: no request leaves the build (no intersphinx, no remote images).
suppress_warnings = ["mystnb.unknown_mime_type"]


# ------------------------------------------------------------------ the build's own steps

def _download_notebook(app, pagename, templatename, context, doctree) -> None:
    """The theme's download menu offers ``_sources/<page>`` (not shipped: html_copy_source is
    off). On a notebook's page it offers the committed notebook instead, from the repository
    (the file `git clone` gets, outputs included), and "print to PDF"; elsewhere only the PDF."""
    for group in context.get("header_buttons", []):
        if group.get("label") != "download-buttons":
            continue
        buttons = [b for b in group["buttons"] if b.get("label") == "download-pdf-button"]
        source = app.env.doc2path(pagename) if pagename in app.env.all_docs else None
        if github and source is not None and str(source).endswith(".ipynb"):
            path = f"{pagename}.ipynb"
            buttons.insert(0, {
                "type": "link", "url": f"{repository_url}/raw/{repository_branch}/{path}",
                "text": ".ipynb", "icon": "fas fa-code", "label": "download-notebook-button",
                "tooltip": f"Download the notebook ({path}, from the repository)"})
        group["buttons"] = buttons


def _ship_mathjax(app, exception) -> None:
    """Copy MathJax's one bundle and its fonts from the sphinx-mathjax-offline package."""
    if exception is not None or app.builder.format != "html":
        return
    import importlib.util

    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None or spec.origin is None:
        raise RuntimeError("sphinx-mathjax-offline is not installed (pip install -r requirements-dev.txt)")
    source = Path(spec.origin).parent / "static" / "mathjax"
    target = Path(app.outdir) / "_static" / "mathjax"
    for name in MATHJAX_FILES:
        origin = source / name
        files = [origin] if origin.is_file() else sorted(p for p in origin.rglob("*") if p.is_file())
        for file in files:
            dest = target / file.relative_to(source)
            if not dest.exists() or dest.stat().st_size != file.stat().st_size:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, dest)


def _fontawesome_by_css() -> bool:
    """Whether the theme's stylesheet draws the icons from Font Awesome's web fonts itself,
    so that its 1.6 MB fontawesome.js (which swaps each icon for an inline SVG) is not needed."""
    import pydata_sphinx_theme

    css = Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme" / "static" / "styles" \
        / "pydata-sphinx-theme.css"
    return css.is_file() and "fa-solid-900.woff2" in css.read_text(encoding="utf-8", errors="replace")


def _prune(app, exception) -> None:
    """Ship only what the pages load: no source maps, no translation catalogues, no copies of
    what another file embeds (the stemmer; sphinx-copybutton's functions and icons), no
    fontawesome.js when the stylesheet draws the icons (_templates/layout.html drops its tag)."""
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    doomed = set(static.rglob("*.map")) | set(static.glob("*webpack-macros.html"))  # the theme's templates
    # Sphinx's readable copies of the search's stemmer: language_data.js carries it, minified.
    doomed |= set(static.glob("*-stemmer.js"))
    # sphinx-copybutton's sources: copybutton.js carries copybutton_funcs.js, and its icons inline.
    doomed |= {static / name for name in ("copybutton_funcs.js", "copy-button.svg", "check-solid.svg")}
    if app.config.html_context.get("mha_no_fontawesome_js"):
        doomed |= set(static.glob("scripts/fontawesome.js*"))
    for path in doomed:
        path.unlink(missing_ok=True)
    shutil.rmtree(static / "locales", ignore_errors=True)
    sources = Path(app.outdir) / "_sources"  # left empty by the theme: html_copy_source is off
    if sources.is_dir() and not any(p.is_file() for p in sources.rglob("*")):
        shutil.rmtree(sources)


def setup(app) -> None:
    app.connect("html-page-context", _download_notebook, priority=900)
    app.connect("build-finished", _ship_mathjax)
    app.connect("build-finished", _prune, priority=900)


# Read by _templates/layout.html, which then leaves out fontawesome.js's <script>.
html_context["mha_no_fontawesome_js"] = _fontawesome_by_css()
