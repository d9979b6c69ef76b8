// The Tidemark console: a hash-routed single page over the console server's JSON API (/api/...).
// Building blocks are in ui.js, message pages in messages.js, management pages in manage.js.

import { lineChart } from "./chart.js";
import { topicCreateForm, topicDeleteSection, usersPage } from "./manage.js";
import { browseSection, dlqPage, messagesPage } from "./messages.js";
import { api, card, enc, errorBox, fmtAge, fmtBytes, fmtMs, fmtNum, h, link, note, status, table } from "./ui.js";

const REFRESH_MS = 2000;
let timer = null;       // the current page's refresh, cleared on navigation
let generation = 0;     // raised by every navigation: a page still loading when the user moved on stays idle
let session = { user: null, read_only: false, sign_in_required: false };

// -- session -------------------------------------------------------------------------------

function signInForm() {
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
  return form;
}

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
  box.replaceChildren(...mode, signInForm());
}

// A page the brokers will not show without credentials: the sign-in form moves from the header to the page.
function signInPrompt(page) {
  document.getElementById("login")?.remove();
  page.replaceChildren(h("section", { class: "signin", id: "signin-prompt" },
    h("h1", {}, "Sign in"),
    note("The brokers ask for credentials: sign in with your access key and secret key to see the cluster."),
    signInForm()));
}

// -- pages -----------------------------------------------------------------------------------

async function overviewPage(page) {
  const doc = await api("/api/overview");
  const serving = doc.brokers.filter((b) => b.health === "SERVING");
  page.replaceChildren(h("h1", {}, "Brokers"),
    h("div", { class: "cards" }, card("brokers", doc.brokers.length), card("serving", serving.length, "serving"),
      card("stored", fmtBytes(doc.brokers.reduce((sum, b) => sum + (b.store_bytes || 0), 0)))),
    table([["name", "name"],
           ["role", (b) => (b.role === "master" && b.replicas
             ? `master (${b.replication}, ${b.replicas} replica, in sync: ${b.in_sync.join(",") || "none"})` : b.role)],
           ["address", "address"],
           ["health", (b) => h("span", { class: `badge ${b.health === "SERVING" ? "ok" : "bad"}`, title: b.error || "" },
                               b.health)],
           ["version", "version"], ["uptime", (b) => fmtAge(b.uptime_ms), { sort: (b) => b.uptime_ms }],
           ["store", (b) => fmtBytes(b.store_bytes), { sort: (b) => b.store_bytes }],
           ["flush", "flush_mode"],
           ["permission", (b) => (b.readable === undefined ? "-" : `${b.readable ? "R" : "-"}${b.writable ? "W" : "-"}`)],
           ["topics", "topics", { num: true }], ["groups", "groups", { num: true }],
           ["clients", "clients", { num: true }],
           ["replica lag", (b) => (b.role === "replica" ? fmtBytes(b.lag_bytes) : "-"), { sort: (b) => b.lag_bytes }]],
          doc.brokers, "no broker", { id: "brokers-table" }));
}

async function topicsPage(page) {
  const system = location.hash.includes("system=1");
  const doc = await api(`/api/topics${system ? "?system=1" : ""}`);
  page.replaceChildren(h("h1", {}, "Topics"),
    h("p", {}, link(system ? "#/topics" : "#/topics?system=1", system ? "hide system topics" : "show system topics")),
    table([["topic", (t) => link(`#/topics/${enc(t.topic)}`, t.topic)], ["brokers", (t) => t.brokers.join(", ")],
           ["queues", "queues", { num: true }], ["perm", "perm"],
           ["msg/s", (t) => (t.rate === null ? "-" : t.rate.toFixed(1)), { num: true, sort: (t) => t.rate }]],
          doc.topics, "no topic", { id: "topics-table" }),
    h("h2", {}, "Create a topic"),
    session.read_only ? note("the console is read-only") : topicCreateForm((d) => {
      if (d.executed) location.hash = `#/topics/${enc(d.topic)}`;
    }));
}

async function topicPage(page, name) {
  const doc = await api(`/api/topics/${enc(name)}`);
  const browse = browseSection(name);
  page.replaceChildren(h("h1", {}, `Topic ${name}`),
    h("div", { class: "cards" }, card("messages stored", fmtNum(doc.stored)),
      card("msg/s", doc.rate === null ? "-" : doc.rate.toFixed(1)), card("queues", doc.queues.length)),
    h("p", {}, link(`#/messages?topic=${enc(name)}`, "look up messages by key or position")),
    h("h2", {}, "Queues"),
    table([["broker", "broker"], ["queue", "queue", { num: true }], ["min offset", "min_offset", { num: true }],
           ["max offset", "max_offset", { num: true }], ["messages", "messages", { num: true }],
           ["last write", (q) => fmtMs(q.last_update_ms), { sort: (q) => q.last_update_ms }]], doc.queues, "no queue",
          { id: "queues-table" }),
    h("h2", {}, "Consumer groups"),
    table([["group", (r) => link(`#/groups/${enc(r.group)}`, r.group)]], doc.groups.map((group) => ({ group })),
          "no group reads this topic", { filter: false }),
    h("h2", {}, "Messages"), browse.element,
    h("h2", {}, "Delete this topic"),
    session.read_only ? note("the console is read-only") : topicDeleteSection(name, (d) => {
      if (d.executed) location.hash = "#/topics";
    }));
  await browse.load();
}

async function groupsPage(page) {
  const doc = await api("/api/groups");
  page.replaceChildren(h("h1", {}, "Consumer groups"),
    table([["group", (g) => link(`#/groups/${enc(g.group)}`, g.group)], ["topics", (g) => g.topics.join(", ")],
           ["members", "members", { num: true }], ["model", "model"], ["lag", "lag", { num: true }]], doc.groups,
          "no group", { id: "groups-table" }));
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
    out.replaceChildren(note(execute ? "applying..." : "computing the preview..."));
    try {
      const doc = await api(`/api/groups/${enc(name)}/reset`, request(execute));
      const apply = h("button", { id: "reset-apply", onclick: () => run(true), type: "button" }, "Apply this reset");
      out.replaceChildren(
        note(execute ? "Offsets moved:" : "Preview (nothing changed yet):"),
        table([["topic", "topic"], ["broker", "broker"], ["queue", "queue", { num: true }],
               ["current", "current", { num: true }], ["new", "new", { num: true }]], doc.changes, "no queue to move",
              { filter: false }),
        execute ? note("reset applied", "reset-done") : apply);
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
  const head = h("div", {}), chart = h("div", { id: "lag-chart" });
  let since = 0, points = [], formShown = false;
  const form = h("div", {});
  // Made once and updated on every refresh, so their sort and filter stay.
  const members = table([["client id", "client_id"], ["host", "host"], ["model", "model"], ["type", "type"],
    ["strategy", "strategy"], ["subscriptions", (m) => m.subscriptions.join(", ")],
    ["queues owned", (m) => m.owned.length, { num: true }],
    ["heartbeat", (m) => fmtMs(m.heartbeat_ms), { sort: (m) => m.heartbeat_ms }]], [], "no live member",
  { id: "members-table" });
  const queues = table([["topic", "topic"], ["broker", "broker"], ["queue", "queue", { num: true }], ["owner", "owner"],
    ["max offset", "max_offset", { num: true }], ["committed", "committed", { num: true }],
    ["lag", "lag", { num: true }], ["lag (s)", "lag_s", { num: true }]], [], "no offsets yet", { id: "group-queues" });
  // Pop groups (RocketMQ 5 consumers): what is received and not acked, to tell a stuck consumer from a slow one.
  const inflight = table([["topic", "topic"], ["broker", "broker"], ["queue", "queue", { num: true }],
    ["in flight", "inflight", { num: true }], ["redelivered", "redelivered", { num: true }],
    ["max attempt", "max_attempt", { num: true }], ["past invisible time", "overdue", { num: true }],
    ["oldest (s)", "oldest_inflight_s", { num: true }], ["next visible (s)", "next_visible_s", { num: true }],
    ["waiting", "waiting", { num: true }], ["condition", "pop"]], [], "nothing in flight", { id: "group-inflight" });
  const pop = h("div", { hidden: true }, h("h2", {}, "In flight (pop)"), inflight);
  page.replaceChildren(h("h1", {}, `Group ${name}`), head, h("h2", {}, "Lag over time (messages)"), chart,
    h("h2", {}, "Members"), members, h("h2", {}, "Queues"), queues, pop, h("h2", {}, "Reset offsets"), form,
    h("p", {}, link(`#/dlq/${enc(name)}`, "dead-letter queue of this group")));
  const update = async () => {
    const doc = await api(`/api/groups/${enc(name)}?since=${since}`);
    points = points.concat(doc.history.filter(([t]) => t > since));
    since = points.length ? points[points.length - 1][0] : since;
    head.replaceChildren(h("div", { class: "cards" },
      h("div", { class: "card" }, h("div", { class: "label" }, "state"),
        h("div", { class: "value" }, h("span", { class: `badge ${doc.state}`, id: "group-state" }, doc.state))),
      card("lag (messages)", fmtNum(doc.lag), "group-lag"), card("lag (oldest unconsumed)", `${doc.lag_s} s`),
      card("members", doc.members.length),
      ...(doc.pop_state ? [card("pop consumers", doc.pop_state, "group-pop-state")] : [])));
    chart.replaceChildren(lineChart(points, { label: `lag of ${name}`, width: chart.clientWidth || 800 }));
    members.update(doc.members);
    queues.update(doc.queues);
    pop.hidden = !doc.pop.length;
    inflight.update(doc.pop);
    if (!formShown && doc.topics.length) {
      form.replaceChildren(session.read_only ? note("the console is read-only") : resetForm(name, doc.topics));
      formShown = true;
    }
    status(`updated ${new Date().toLocaleTimeString()}`);
  };
  const mine = generation;
  await update();
  if (mine !== generation) return;  // the user navigated away while the first load ran
  timer = setInterval(() => update().catch((e) => status(`refresh failed: ${e.message}`)), REFRESH_MS);
}

// -- router ----------------------------------------------------------------------------------

const ROUTES = [
  [/^#?\/?$/, "overview", overviewPage],
  [/^#\/topics(\?.*)?$/, "topics", topicsPage],
  [/^#\/topics\/([^?]+)$/, "topics", topicPage],
  [/^#\/groups$/, "groups", groupsPage],
  [/^#\/groups\/([^?]+)$/, "groups", groupPage],
  [/^#\/messages(\?.*)?$/, "messages", messagesPage],
  [/^#\/dlq\/([^?]+)$/, "groups", (page, name) => dlqPage(page, name, session)],
  [/^#\/users$/, "users", (page) => usersPage(page, session)],
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
  if (!session.user && session.sign_in_required) {
    signInPrompt(page);
    return;
  }
  page.dataset.loading = "1";
  try {
    await render(page, arg && !arg.startsWith("?") ? decodeURIComponent(arg) : undefined);
  } catch (e) {
    if (e.status === 401 && !session.user) signInPrompt(page);
    else page.replaceChildren(errorBox(e));
  } finally {
    delete page.dataset.loading;
  }
}

window.addEventListener("hashchange", route);
route();
