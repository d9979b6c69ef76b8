// The Tidemark console: a hash-routed single page over the console server's JSON API (/api/...).
// Every DOM node is built with h() from text, never from HTML strings, so nothing a broker returns
// (topic names, message bodies) can run as markup.

import { lineChart } from "./chart.js";

const REFRESH_MS = 2000;
let timer = null;       // the current page's refresh, cleared on navigation
let generation = 0;     // raised by every navigation: a page still loading when the user moved on stays idle
let session = { user: null, read_only: false };

function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

async function api(path, body) {
  // The header is the console's CSRF guard: cross-site forms cannot send it.
  const init = body === undefined ? {} : { method: "POST", body: JSON.stringify(body),
                                           headers: { "Content-Type": "application/json", "X-Tidemark-Console": "1" } };
  const resp = await fetch(path, init);
  const doc = await resp.json().catch(() => ({ error: `HTTP ${resp.status}` }));
  if (!resp.ok) throw new Error(doc.error || `HTTP ${resp.status}`);
  return doc;
}

const enc = encodeURIComponent;
const fmtMs = (ms) => (ms ? new Date(ms).toLocaleString() : "-");
const fmtNum = (n) => (n === null || n === undefined ? "-" : Number(n).toLocaleString());
const fmtAge = (ms) => {
  if (!ms) return "-";
  const s = Math.round(ms / 1000);
  return s < 120 ? `${s} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`;
};
const link = (href, text) => h("a", { href }, text);

// columns: [label, key or fn(row), {num: true}]
function table(columns, rows, empty = "nothing here yet") {
  if (!rows.length) return h("p", { class: "note" }, empty);
  return h("table", {},
    h("thead", {}, h("tr", {}, columns.map(([label, , o]) => h("th", { class: o?.num ? "num" : null }, label)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, columns.map(([, get, o]) =>
      h("td", { class: o?.num ? "num" : null }, typeof get === "function" ? get(r) : fmtCell(r[get])))))));
}
const fmtCell = (v) => (typeof v === "number" ? v.toLocaleString() : v === null || v === undefined ? "-" : String(v));

function card(label, value, id) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value", id }, value));
}

function errorBox(e) {
  return h("p", { class: "error", role: "alert" }, e.message || String(e));
}

function status(text) {
  document.getElementById("status").textContent = text;
}

// -- session -------------------------------------------------------------------------------

async function renderSession() {
  const box = document.getElementById("session");
  try {
    session = await api("/api/session");
  } catch (e) {
    box.replaceChildren(errorBox(e));
    return;
  }
  const mode = session.read_only ? [h("span", { class: "badge" }, "read-only")] : [];
  if (session.user) {
    box.replaceChildren(...mode, h("span", { id: "user" }, `signed in as ${session.user}`),
      h("button", { class: "secondary", onclick: async () => { await api("/api/logout", {}); route(); } },
        "Sign out"));
    return;
  }
  const key = h("input", { name: "access_key", placeholder: "access key", autocomplete: "username" });
  const secret = h("input", { name: "secret_key", type: "password", placeholder: "secret key",
                              autocomplete: "current-password" });
  const form = h("form", { id: "login", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      await api("/api/login", { access_key: key.value, secret_key: secret.value });
      route();
    } catch (e) {
      form.replaceChildren(errorBox(e), key, secret, h("button", {}, "Sign in"));
    }
  } }, key, secret, h("button", {}, "Sign in"));
  box.replaceChildren(...mode, form);
}

// -- pages -----------------------------------------------------------------------------------

const fmtBytes = (n) => {
  if (n === undefined || n === null) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
};

async function overviewPage(page) {
  const doc = await api("/api/overview");
  const serving = doc.brokers.filter((b) => b.health === "SERVING");
  page.replaceChildren(h("h1", {}, "Brokers"),
    h("div", { class: "cards" }, card("brokers", doc.brokers.length), card("serving", serving.length, "serving"),
      card("stored", fmtBytes(doc.brokers.reduce((sum, b) => sum + (b.store_bytes || 0), 0)))),
    table([["name", "name"], ["role", (b) => (b.role === "master" && b.replicas ? `master (${b.replication}, ${b.replicas} replica)` : b.role)],
           ["address", "address"],
           ["health", (b) => h("span", { class: `badge ${b.health === "SERVING" ? "ok" : "bad"}`, title: b.error || "" },
                               b.health)],
           ["version", "version"], ["uptime", (b) => fmtAge(b.uptime_ms)], ["store", (b) => fmtBytes(b.store_bytes)],
           ["flush", "flush_mode"],
           ["permission", (b) => (b.readable === undefined ? "-" : `${b.readable ? "R" : "-"}${b.writable ? "W" : "-"}`)],
           ["topics", "topics", { num: true }], ["groups", "groups", { num: true }],
           ["clients", "clients", { num: true }],
           ["replica lag", (b) => (b.role === "replica" ? fmtBytes(b.lag_bytes) : "-")]],
          doc.brokers));
}

async function topicsPage(page) {
  const system = location.hash.includes("system=1");
  const doc = await api(`/api/topics${system ? "?system=1" : ""}`);
  page.replaceChildren(h("h1", {}, "Topics"),
    h("p", {}, link(system ? "#/topics" : "#/topics?system=1", system ? "hide system topics" : "show system topics")),
    table([["topic", (t) => link(`#/topics/${enc(t.topic)}`, t.topic)], ["brokers", (t) => t.brokers.join(", ")],
           ["queues", "queues", { num: true }], ["perm", "perm"],
           ["msg/s", (t) => (t.rate === null ? "-" : t.rate.toFixed(1)), { num: true }]], doc.topics));
}

async function topicPage(page, name) {
  const doc = await api(`/api/topics/${enc(name)}`);
  page.replaceChildren(h("h1", {}, `Topic ${name}`),
    h("div", { class: "cards" }, card("messages stored", fmtNum(doc.stored)),
      card("msg/s", doc.rate === null ? "-" : doc.rate.toFixed(1)), card("queues", doc.queues.length)),
    h("p", {}, link(`#/messages?topic=${enc(name)}`, "look up messages")),
    h("h2", {}, "Queues"),
    table([["broker", "broker"], ["queue", "queue", { num: true }], ["min offset", "min_offset", { num: true }],
           ["max offset", "max_offset", { num: true }], ["messages", "messages", { num: true }],
           ["last write", (q) => fmtMs(q.last_update_ms)]], doc.queues),
    h("h2", {}, "Consumer groups"),
    table([["group", (r) => link(`#/groups/${enc(r.group)}`, r.group)]], doc.groups.map((group) => ({ group })),
          "no group reads this topic"));
}

async function groupsPage(page) {
  const doc = await api("/api/groups");
  page.replaceChildren(h("h1", {}, "Consumer groups"),
    table([["group", (g) => link(`#/groups/${enc(g.group)}`, g.group)], ["topics", (g) => g.topics.join(", ")],
           ["members", "members", { num: true }], ["model", "model"], ["lag", "lag", { num: true }]], doc.groups));
}

function resetForm(name, topics) {
  const topic = h("select", { name: "topic" }, topics.map((t) => h("option", { value: t }, t)));
  const target = h("select", { name: "target" },
    [["earliest", "to earliest"], ["latest", "to latest"], ["offset", "to offset"], ["shift", "shift by"],
     ["timestamp", "to time"]].map(([v, l]) => h("option", { value: v }, l)));
  const value = h("input", { name: "value", placeholder: "offset, shift or time", size: 22 });
  const queue = h("input", { name: "queue", placeholder: "all", size: 5 });
  const broker = h("input", { name: "broker", placeholder: "any", size: 10 });
  const out = h("div", { id: "reset-result" });
  const request = (execute) => {
    const doc = { topic: topic.value, target: target.value, execute };
    if (["offset", "shift"].includes(target.value)) doc.value = Number.parseInt(value.value || "0", 10);
    if (target.value === "timestamp") doc.value = Date.parse(value.value);
    if (queue.value.trim()) doc.queue = Number.parseInt(queue.value, 10);
    if (broker.value.trim()) doc.broker = broker.value.trim();  // a topic on several brokers repeats queue ids
    return doc;
  };
  const run = async (execute) => {
    out.replaceChildren(h("p", { class: "note" }, execute ? "applying..." : "computing the preview..."));
    try {
      const doc = await api(`/api/groups/${enc(name)}/reset`, request(execute));
      const apply = h("button", { id: "reset-apply", onclick: () => run(true), type: "button" }, "Apply this reset");
      out.replaceChildren(
        h("p", { class: "note" }, execute ? "Offsets moved:" : "Preview (nothing changed yet):"),
        table([["topic", "topic"], ["broker", "broker"], ["queue", "queue", { num: true }],
               ["current", "current", { num: true }], ["new", "new", { num: true }]], doc.changes, "no queue to move"),
        execute ? h("p", { id: "reset-done", class: "note" }, "reset applied") : apply);
    } catch (e) {
      out.replaceChildren(errorBox(e));
    }
  };
  return h("div", {},
    h("form", { class: "inline", id: "reset-form", onsubmit: (ev) => { ev.preventDefault(); run(false); } },
      h("label", {}, "topic", topic), h("label", {}, "target", target), h("label", {}, "value", value),
      h("label", {}, "queue", queue), h("label", {}, "broker", broker),
      h("button", { id: "reset-preview" }, "Preview reset")),
    out);
}

async function groupPage(page, name) {
  const head = h("div", {}), chart = h("div", { id: "lag-chart" }), tables = h("div", {});
  let since = 0, points = [], formShown = false;
  const form = h("div", {});
  page.replaceChildren(h("h1", {}, `Group ${name}`), head, h("h2", {}, "Lag over time (messages)"), chart,
    tables, h("h2", {}, "Reset offsets"), form,
    h("p", {}, link(`#/dlq/${enc(name)}`, "dead-letter queue of this group")));
  const update = async () => {
    const doc = await api(`/api/groups/${enc(name)}?since=${since}`);
    points = points.concat(doc.history.filter(([t]) => t > since));
    since = points.length ? points[points.length - 1][0] : since;
    head.replaceChildren(h("div", { class: "cards" },
      h("div", { class: "card" }, h("div", { class: "label" }, "state"),
        h("div", { class: "value" }, h("span", { class: `badge ${doc.state}`, id: "group-state" }, doc.state))),
      card("lag (messages)", fmtNum(doc.lag), "group-lag"), card("lag (oldest unconsumed)", `${doc.lag_s} s`),
      card("members", doc.members.length)));
    chart.replaceChildren(lineChart(points, { label: `lag of ${name}`, width: chart.clientWidth || 800 }));
    tables.replaceChildren(h("h2", {}, "Members"),
      table([["client id", "client_id"], ["host", "host"], ["model", "model"], ["type", "type"],
             ["strategy", "strategy"], ["subscriptions", (m) => m.subscriptions.join(", ")],
             ["queues owned", (m) => m.owned.length, { num: true }], ["heartbeat", (m) => fmtMs(m.heartbeat_ms)]],
            doc.members, "no live member"),
      h("h2", {}, "Queues"),
      table([["topic", "topic"], ["broker", "broker"], ["queue", "queue", { num: true }], ["owner", "owner"],
             ["max offset", "max_offset", { num: true }], ["committed", "committed", { num: true }],
             ["lag", "lag", { num: true }], ["lag (s)", "lag_s", { num: true }]], doc.queues, "no offsets yet"));
    if (!formShown && doc.topics.length) {
      form.replaceChildren(session.read_only ? h("p", { class: "note" }, "the console is read-only")
                                             : resetForm(name, doc.topics));
      formShown = true;
    }
    status(`updated ${new Date().toLocaleTimeString()}`);
  };
  const mine = generation;
  await update();
  if (mine !== generation) return;  // the user navigated away while the first load ran
  timer = setInterval(() => update().catch((e) => status(`refresh failed: ${e.message}`)), REFRESH_MS);
}

function messageView(m) {
  return h("article", { class: "message" },
    h("h2", {}, `${m.origin_topic} · ${m.broker} · queue ${m.queue} · offset ${m.offset}`),
    table([["field", "k"], ["value", "v"]],
      [["msg id", m.msg_id], ["keys", m.keys], ["tags", m.tags], ["born", fmtMs(m.born_ms)],
       ["stored", fmtMs(m.stored_ms)], ["reconsume times", m.reconsume_times], ["size", `${m.size} bytes`],
       ...Object.entries(m.properties).map(([k, v]) => [`property ${k}`, v])].map(([k, v]) => ({ k, v }))),
    h("pre", { class: "body" }, m.body),
    m.body_cut ? h("p", { class: "note" }, `${m.body_cut} more bytes not shown`) : null,
    m.body_encoding === "base64" ? h("p", { class: "note" }, "binary body, shown as base64") : null);
}

async function messagesPage(page) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const field = (name, placeholder, size = 14) =>
    h("label", {}, name, h("input", { name, placeholder, size, value: params.get(name) || "" }));
  const out = h("div", { id: "message-results" });
  const form = h("form", { class: "inline", id: "message-form", onsubmit: (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const input of form.querySelectorAll("input")) if (input.value) q.set(input.name, input.value);
    location.hash = `#/messages?${q}`;
  } }, field("msg_id", "msg id", 34), field("topic", "topic"), field("key", "message key"), field("broker", "any", 10), field("queue", "id", 5),
     field("offset", "offset", 10), h("button", {}, "Look up"));
  page.replaceChildren(h("h1", {}, "Messages"), h("p", { class: "note" },
    "By msg id, by key (last 7 days), or by queue position: topic, queue and offset."), form, out);
  if (!params.get("topic") && !params.get("msg_id")) return;
  try {
    const doc = await api(`/api/messages?${params}`);
    out.replaceChildren(...(doc.messages.length ? doc.messages.map(messageView)
                                                : [h("p", { class: "note" }, "no message found")]));
  } catch (e) {
    out.replaceChildren(errorBox(e));
  }
}

async function dlqPage(page, name) {
  const doc = await api(`/api/dlq/${enc(name)}`);
  const result = h("div", { id: "requeue-result" });
  const requeue = async (body) => {
    try {
      const r = await api(`/api/dlq/${enc(name)}/requeue`, body);
      result.replaceChildren(h("p", { class: "note" }, `${r.requeued.length} message(s) requeued`));
    } catch (e) {
      result.replaceChildren(errorBox(e));
    }
  };
  const actions = !session.read_only && doc.messages.length;
  page.replaceChildren(h("h1", {}, `Dead letters of ${name}`), h("p", { class: "note" }, doc.topic),
    h("p", {}, actions ? h("button", { id: "requeue-all", onclick: () => requeue({ all: true }) }, "Requeue all")
                       : null),
    result,
    table([["msg id", "msg_id"], ["original topic", "origin_topic"], ["reconsumed", "reconsume_times", { num: true }],
           ["stored", (m) => fmtMs(m.stored_ms)], ["body", (m) => m.body],
           ["", (m) => (actions ? h("button", { class: "secondary", onclick: () => requeue({ msg_id: m.msg_id }) },
                                    "Requeue") : "")]], doc.messages, "the dead-letter queue is empty"));
}

// -- router ----------------------------------------------------------------------------------

const ROUTES = [
  [/^#?\/?$/, "overview", overviewPage],
  [/^#\/topics(\?.*)?$/, "topics", topicsPage],
  [/^#\/topics\/([^?]+)$/, "topics", topicPage],
  [/^#\/groups$/, "groups", groupsPage],
  [/^#\/groups\/([^?]+)$/, "groups", groupPage],
  [/^#\/messages(\?.*)?$/, "messages", messagesPage],
  [/^#\/dlq\/([^?]+)$/, "groups", dlqPage],
];

async function route() {
  generation += 1;
  clearInterval(timer);
  timer = null;
  await renderSession();
  const page = document.getElementById("page");
  const hash = location.hash || "#/";
  const found = ROUTES.find(([re]) => re.test(hash));
  if (!found) {
    page.replaceChildren(h("h1", {}, "Not found"), link("#/", "back to the brokers"));
    return;
  }
  const [re, nav, render] = found;
  const arg = hash.match(re)[1];
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === nav));
  page.dataset.loading = "1";
  try {
    await render(page, arg && !arg.startsWith("?") ? decodeURIComponent(arg) : undefined);
  } catch (e) {
    page.replaceChildren(errorBox(e));
  } finally {
    delete page.dataset.loading;
  }
}

window.addEventListener("hashchange", route);
route();
