// The book's search box: the index (search-index.js, a plain script so that it loads from file:// too) is
// loaded on first use; every word typed must appear in a section's title or text.
(function () {
  var input = document.getElementById("search-input");
  var list = document.getElementById("search-results");
  var root = document.documentElement.getAttribute("data-root") || "";
  var loading = false;
  function load(then) {
    if (window.BOOK_SEARCH_INDEX) { then(); return; }
    if (loading) return;
    loading = true;
    var script = document.createElement("script");
    script.src = root + "search-index.js";
    script.onload = then;
    document.head.appendChild(script);
  }
  function escapeHtml(text) {
    return text.replace(/[&<>"]/g, function (c) { return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]; });
  }
  function search() {
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    list.innerHTML = "";
    if (!words.length || !window.BOOK_SEARCH_INDEX) return;
    var hits = [];
    window.BOOK_SEARCH_INDEX.forEach(function (entry) {
      var title = entry.title.toLowerCase(), text = entry.text.toLowerCase();
      if (words.every(function (w) { return title.indexOf(w) >= 0 || text.indexOf(w) >= 0; })) {
        var score = words.filter(function (w) { return title.indexOf(w) >= 0; }).length;
        hits.push([score, entry]);
      }
    });
    hits.sort(function (a, b) { return b[0] - a[0]; });
    hits.slice(0, 25).forEach(function (hit) {
      var entry = hit[1], at = entry.text.toLowerCase().indexOf(words[0]);
      var snippet = entry.text.substr(Math.max(0, at - 60), 160);
      var item = document.createElement("li");
      item.innerHTML = '<a href="' + root + entry.url + '">' + escapeHtml(entry.title) + '</a><small>' +
        escapeHtml(entry.page) + " — " + escapeHtml(snippet) + "</small>";
      list.appendChild(item);
    });
    if (!hits.length) list.innerHTML = "<li>No match.</li>";
  }
  input.addEventListener("focus", function () { load(search); });
  input.addEventListener("input", function () { load(search); });
  input.addEventListener("keydown", function (event) {
    if (event.key === "Escape") { input.value = ""; list.innerHTML = ""; }
  });
})();
