"""The course as a book: a static site of every phase (rendered from the learner notebooks in phases/) and
every guide in docs/, built offline by `bash scripts/book.sh` (`python -m book build`).

Mirrors no vllm/v1 file. One concern per module:

- `slugs`: heading anchors, the same rule for the Markdown guides, the README links and the site;
- `pages`: which pages the site has, in which order (the phases, then the guides);
- `markdown`: Markdown -> HTML (markdown-it-py) with anchored headings and links rewritten to the site;
- `notebook`: a learner notebook -> HTML, its Mini build executed (cached), widgets shown as their text twin;
- `execute`: runs a notebook's cells before the Lab in a process and kernel of its own;
- `layout`: the page template: navigation, search box, the "run it yourself" box;
- `search`: the search index the search box reads;
- `build`: puts it together into _build/book/;
- `check`: static checks of a built site (links, anchors, no solution code), used by the tests;
- `results`, `record`, `tables`: benchmark result files and the tables docs/benchmarks.md shows.
"""
