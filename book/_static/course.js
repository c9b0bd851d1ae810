/* The course's two fixes on top of the book theme (conf.py loads this after the theme's scripts).
 *
 * 1. Navigation. pydata-sphinx-theme wires its sidebar buttons with document.querySelector,
 *    which finds the navbar's copies (hidden by sphinx-book-theme), not the visible ☰ and
 *    "Contents" buttons in the article header. A click on a visible button is handed to the
 *    wired one, so the theme's own code runs: a drawer on narrow screens, and on wide screens
 *    the primary sidebar collapses and comes back (sphinx-book-theme's handler).
 * 2. Code and outputs that fit. Every <pre> in the article is split into one block a line,
 *    so that course.css can wrap a long line with a hanging indent under its own indentation
 *    and a ↪ on each continuation row. The text is unchanged: each line keeps its "\n".
 * 3. Figures, sized to the column by course.css, open at full size on a click.
 * 4. Search excerpts from the page's text. Sphinx's search (searchtools.js) cuts each result's
 *    excerpt from the page's [role=main], which in this theme also holds the article's header
 *    buttons ("System Settings Light Dark"), the print-only table of contents and the page's
 *    contents sidebar. Search.htmlToText is wrapped to read the <article> only, without the
 *    box of links under the title. Everything else of Sphinx's search is its own.
 */
(function () {
  "use strict";

  function wireToggles() {
    ["primary-toggle", "secondary-toggle"].forEach(function (name) {
      var wired = document.querySelector("." + name); // the one the theme listens to
      if (!wired) return;
      document.querySelectorAll("." + name).forEach(function (button) {
        if (button === wired) return;
        button.addEventListener("click", function (event) {
          event.preventDefault();
          event.stopImmediatePropagation();
          wired.click();
        }, true);
      });
    });
  }

  // The lines of `node`, each a list of nodes (shallow copies of the elements a line crosses).
  function splitLines(node) {
    if (node.nodeType === Node.TEXT_NODE) {
      var parts = node.data.split("\n");
      return parts.map(function (part, i) {
        if (i < parts.length - 1) return [document.createTextNode(part + "\n")];
        return part ? [document.createTextNode(part)] : [];
      });
    }
    if (node.nodeType !== Node.ELEMENT_NODE) return [[]];
    var lines = splitChildren(node);
    return lines.map(function (fragment) {
      var copy = node.cloneNode(false);
      fragment.forEach(function (child) { copy.appendChild(child); });
      return [copy];
    });
  }

  function splitChildren(node) {
    var lines = [[]];
    node.childNodes.forEach(function (child) {
      splitLines(child).forEach(function (fragment, i) {
        if (i > 0) lines.push([]);
        Array.prototype.push.apply(lines[lines.length - 1], fragment);
      });
    });
    return lines;
  }

  function lineBlocks(pre) {
    if (pre.classList.contains("mha-lines")) return;
    var lines = splitChildren(pre);
    var block = document.createDocumentFragment();
    lines.forEach(function (fragment) {
      var line = document.createElement("span");
      line.className = "mha-line";
      fragment.forEach(function (child) { line.appendChild(child); });
      var text = line.textContent;
      if (!text) return; // after the last "\n"
      line.style.setProperty("--mha-indent", String(text.length - text.replace(/^ +/, "").length));
      block.appendChild(line);
    });
    pre.replaceChildren(block);
    pre.classList.add("mha-lines");
  }

  // 3. Figures: sized to the column (course.css); a click opens the image at full size.
  function zoomable(img) {
    if (img.closest("a")) return;
    var link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.className = "mha-zoom";
    link.title = "Open the figure at full size";
    img.replaceWith(link);
    link.appendChild(img);
  }

  // 4. Search excerpts: the article's text only.
  var CHROME = ".headerlink, script, style, .mha-launch, .toctree-wrapper";
  function articleText(htmlString, anchor) {
    var doc = new DOMParser().parseFromString(htmlString, "text/html");
    var article = doc.querySelector("article.bd-article") || doc.querySelector("article");
    if (!article) return null;
    article.querySelectorAll(CHROME).forEach(function (e) { e.remove(); });
    if (anchor) {
      var part = article.querySelector(anchor);
      if (part) return part.textContent;
    }
    return article.textContent;
  }

  function patchSearch() {
    // searchtools.js declares `const Search`: a global binding, not a property of window.
    var search = typeof Search !== "undefined" ? Search : window.Search;
    if (!search || typeof search.htmlToText !== "function" || search.htmlToText.mhaArticle) return;
    var original = search.htmlToText;
    var patched = function (htmlString, anchor) {
      var text = null;
      try { text = articleText(htmlString, anchor); } catch (e) { text = null; }
      return text === null ? original.call(search, htmlString, anchor) : text;
    };
    patched.mhaArticle = true;
    search.htmlToText = patched;
  }
  patchSearch(); // searchtools.js may already be loaded; else at DOMContentLoaded (below)

  function run() {
    patchSearch();
    wireToggles();
    document.querySelectorAll("article .cell_output img").forEach(zoomable);
    document.querySelectorAll("article pre").forEach(lineBlocks);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", run);
  } else {
    run();
  }
})();
