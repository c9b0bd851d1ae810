"""Sphinx configuration of the course's web book (``make book``; see book/build.py).

The book is built from the notebooks as committed, with their stored outputs: nothing is
executed, and nothing is downloaded (the theme and MathJax come from PyPI packages).
"""

from __future__ import annotations

import os

# ----------------------------------------------------------------- the one setting to edit
# The course's public repository. The book's "Open in Colab" links, the install line for
# Colab and the repository button are all built from it. Set it here once the course has a
# public home; MHA_REPOSITORY_URL overrides it for one build (the GitHub Pages workflow
# sets it to the repository it runs in, so the published book is always right).
REPOSITORY_URL = "https://github.com/OWNER/REPO"
REPOSITORY_BRANCH = "main"

repository_url = (os.environ.get("MHA_REPOSITORY_URL") or REPOSITORY_URL).rstrip("/")
repository_branch = os.environ.get("MHA_REPOSITORY_BRANCH") or REPOSITORY_BRANCH

# ------------------------------------------------------------------------------ Sphinx
project = "Multi-head attention, from one dot product to the full module"
author = "the course's authors"
copyright = "the course's authors; MIT licence"  # noqa: A001 - Sphinx's name

extensions = [
    "myst_nb",  # notebooks and MyST markdown
    "sphinx-mathjax-offline",  # MathJax 3 from the package, copied into _static/ (no CDN)
    "sphinx.ext.githubpages",  # .nojekyll, for GitHub Pages
]

# The notebooks as committed: their stored outputs, never re-executed.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "conf.py", "build.py"]
templates_path: list[str] = []
html_static_path = ["_static"]
html_css_files = ["course.css"]
# course.js: the visible sidebar buttons work (the theme wires hidden copies), long lines wrap.
html_js_files = ["course.js"]

html_theme = "sphinx_book_theme"
html_title = "Multi-head attention"
html_copy_source = False  # the notebooks are in the repository; no _sources/ copies
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "repository_url": repository_url,
    "repository_branch": repository_branch,
    "path_to_docs": "",
    "use_repository_button": True,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "navigation_with_keys": False,
}

# default_mode: the theme's light/dark switch starts on the reader's system setting (without
# it, the theme logs an error to the console on a first visit).
html_context = {"default_mode": "auto"}
html_favicon = "_static/favicon.svg"

# Offline: no request leaves the build (no intersphinx, no remote images).
suppress_warnings = ["mystnb.unknown_mime_type"]
