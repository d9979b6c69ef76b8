// Building blocks of the console's pages: DOM nodes from text (h), the JSON API (api), formatting,
// sortable and filterable tables, and the plan-then-apply flow every change follows.
// Every DOM node is built with h() from text, never from HTML strings, so nothing a broker returns
// (topic names, message bodies) can run as markup.

export function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

// An API error keeps its HTTP status: a 401 before sign-in shows the sign-in prompt, not the message.
export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

export async function api(path, body) {
  // The header is the console's CSRF guard: cross-site forms cannot send it.
  const init = body === undefined ? {} : { method: "POST", body: JSON.stringify(body),
                                           headers: { "Content-Type": "application/json", "X-Tidemark-Console": "1" } };
  const resp = await fetch(path, init);
  const doc = await resp.json().catch(() => ({ error: `HTTP ${resp.status}` }));
  if (!resp.ok) throw new ApiError(doc.error || `HTTP ${resp.status}`, resp.status);
  return doc;
}

export const enc = encodeURIComponent;
export const fmtMs = (ms) => (ms ? new Date(ms).toLocaleString() : "-");
export const fmtNum = (n) => (n === null || n === undefined ? "-" : Number(n).toLocaleString());
export const fmtAge = (ms) => {
  if (!ms) return "-";
  const s = Math.round(ms / 1000);
  return s < 120 ? `${s} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`;
};
export const fmtBytes = (n) => {
  if (n === undefined || n === null) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
};
export const link = (href, text) => h("a", { href }, text);
const fmtCell = (v) => (typeof v === "number" ? v.toLocaleString() : v === null || v === undefined ? "-" : String(v));

export function card(label, value, id) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value", id }, value));
}

export function errorBox(e) {
  return h("p", { class: "error", role: "alert" }, e.message || String(e));
}

export const note = (text, id) => h("p", { class: "note", id }, text);

export function status(text) {
  document.getElementById("status").textContent = text;
}

// -- tables ----------------------------------------------------------------------------------

// A row's value in a column, for sorting: the field itself, the column's `sort` function, or the text shown.
function sortValue(column, row) {
  const [, get, o] = column;
  if (o?.sort) return o.sort(row);
  if (typeof get !== "function") return row[get];
  const shown = get(row);
  return shown instanceof Node ? shown.textContent : shown;
}

function compare(a, b) {
  const missing = (v) => v === null || v === undefined || v === "" || v === "-";
  if (missing(a) || missing(b)) return missing(a) - missing(b);  // blanks last either way
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), undefined, { numeric: true, sensitivity: "base" });
}

// columns: [label, key or fn(row), {num: true, sort: fn(row)}]. Headers sort (click again: the other way),
// the filter box keeps rows whose shown text contains its words. The element's update(rows) redraws the
// rows and keeps the sort and the filter (pages refreshing every few seconds call it).
export function table(columns, rows, empty = "nothing here yet", { id, filter = true } = {}) {
  let sortBy = null, descending = false, current = rows;
  const body = h("tbody"), foot = h("p", { class: "note rows" });
  const heads = columns.map((column, i) => h("th", { class: column[2]?.num ? "num" : null, tabindex: 0,
    title: "sort by this column", onclick: () => sortOn(i), onkeydown: (ev) => { if (ev.key === "Enter") sortOn(i); } },
    column[0]));
  const box = h("input", { type: "search", class: "filter", placeholder: "filter rows", "aria-label": "filter rows",
                           oninput: () => draw() });
  const grid = h("table", { id }, h("thead", {}, h("tr", {}, heads)), body);
  const emptyNote = note(empty);
  const wrap = h("div", { class: "table" });

  function sortOn(i) {
    descending = sortBy === i ? !descending : false;
    sortBy = i;
    draw();
  }
  function draw() {
    heads.forEach((th, i) => {
      if (i === sortBy) th.setAttribute("aria-sort", descending ? "descending" : "ascending");
      else th.removeAttribute("aria-sort");
    });
    let shown = current.map((r) => [r, h("tr", {}, columns.map(([, get, o]) =>
      h("td", { class: o?.num ? "num" : null }, typeof get === "function" ? get(r) : fmtCell(r[get]))))]);
    const words = box.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    if (words.length) shown = shown.filter(([, tr]) => words.every((w) => tr.textContent.toLowerCase().includes(w)));
    if (sortBy !== null) {
      const col = columns[sortBy];
      shown.sort(([a], [b]) => compare(sortValue(col, a), sortValue(col, b)) * (descending ? -1 : 1));
    }
    body.replaceChildren(...shown.map(([, tr]) => tr));
    foot.textContent = words.length ? `${shown.length} of ${current.length} rows` : "";
  }
  wrap.update = (newRows) => {
    current = newRows;
    if (!current.length && !box.value) {
      wrap.replaceChildren(emptyNote);
      return;
    }
    if (!grid.isConnected) wrap.replaceChildren(...(filter && current.length > 1 ? [box] : []), grid, foot);
    draw();
  };
  wrap.update(rows);
  return wrap;
}

// -- changes: a plan first, then Apply --------------------------------------------------------

// call(execute) posts the change; render(doc) shows a plan or a result. The plan comes with an Apply
// button (and any `also` buttons: [label, extra request fields]); nothing changes before one is clicked.
export async function planned(out, call, render, { apply = "Apply", also = [], done } = {}) {
  out.replaceChildren(note("computing the plan..."));
  const run = async (extra) => {
    out.replaceChildren(note("applying..."));
    try {
      const doc = await call(true, extra);
      out.replaceChildren(note("Done:", "plan-done"), render(doc));
      if (done) done(doc);
    } catch (e) {
      out.replaceChildren(errorBox(e));
    }
  };
  try {
    const doc = await call(false, {});
    out.replaceChildren(h("div", { class: "plan", role: "region", "aria-label": "plan" },
      note("Plan (nothing changed yet):"), render(doc),
      h("p", { class: "buttons" },
        h("button", { type: "button", class: "apply", onclick: () => run({}) }, apply),
        also.map(([label, extra]) => h("button", { type: "button", class: "danger", onclick: () => run(extra) }, label)),
        h("button", { type: "button", class: "secondary", onclick: () => out.replaceChildren() }, "Cancel"))));
  } catch (e) {
    out.replaceChildren(errorBox(e));
  }
}

// A list of label/value pairs (a plan's summary).
export function facts(pairs) {
  return h("dl", { class: "facts" }, pairs.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, fmtCell(v))]));
}
