// The trajectory page's few behaviours; the page works without them.
"use strict";

// Times as the reader's clock shows them, the zone named (the server writes UTC, and says so: that
// text stays as the title, and is what a reader without scripts sees).
const clock = new Intl.DateTimeFormat(undefined, {
  year: "numeric", month: "short", day: "numeric", hour: "numeric", minute: "2-digit", second: "2-digit",
  timeZoneName: "short",
});
for (const node of document.querySelectorAll("time[datetime]")) {
  const when = new Date(node.getAttribute("datetime"));
  if (!Number.isNaN(when.getTime())) {
    node.title = node.textContent;
    node.textContent = clock.format(when);
  }
}

// Tables sort by a column when its header is clicked (numbers by their data-value).
function cellValue(row, index) {
  const cell = row.cells[index];
  const value = cell ? cell.getAttribute("data-value") : null;
  return value !== null ? Number(value) : (cell ? cell.textContent.trim().toLowerCase() : "");
}

for (const table of document.querySelectorAll("table.sortable")) {
  table.querySelectorAll("thead th").forEach((header, index) => {
    header.addEventListener("click", () => {
      const body = table.tBodies[0];
      const descending = header.getAttribute("aria-sort") !== "descending";
      table.querySelectorAll("thead th").forEach((other) => other.removeAttribute("aria-sort"));
      header.setAttribute("aria-sort", descending ? "descending" : "ascending");
      const rows = Array.from(body.rows).sort((a, b) => {
        const left = cellValue(a, index), right = cellValue(b, index);
        const order = left < right ? -1 : left > right ? 1 : 0;
        return descending ? -order : order;
      });
      rows.forEach((row) => body.appendChild(row));
    });
  });
}

// The trajectory list narrows to the rows containing what is typed in its filter box.
const filter = document.getElementById("row-filter");
if (filter) {
  filter.addEventListener("input", () => {
    const wanted = filter.value.trim().toLowerCase();
    for (const row of document.querySelectorAll("#trajectories tbody tr")) {
      row.hidden = wanted !== "" && !row.textContent.toLowerCase().includes(wanted);
    }
  });
}
