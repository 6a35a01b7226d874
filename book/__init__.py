"""The course as a book: a static site of every phase (rendered from the learner notebooks in phases/) and
every guide in docs/, built offline by `bash scripts/book.sh` (`python -m book build`).

Mirrors no vllm/v1 file. One concern per module:

- `slugs`: heading anchors, the same rule for the Markdown guides, the README links and the site;
- `pages`: which pages the site has, in which order (the phases, then the guides);
- `markdown`: Markdown -> HTML (markdown-it-py) with anchored headings and links rewritten to the site;
- `notebook`: a learner notebook -> HTML, its Mini build executed, widgets shown as their static text;
- `layout`: the page template: navigation, search box, the "run it yourself" box;
- `search`: the search index the search box reads;
- `build`: puts it together into _build/book/;
- `results`, `record`, `tables`: benchmark result files and the tables docs/benchmarks.md shows.
"""
