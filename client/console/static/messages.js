// Message pages: lookups (by msg id, key or position), browsing a topic (newest, or from a time) and a
// group's dead letters with what was already requeued.

import { api, enc, errorBox, fmtMs, h, link, note, planned, table, card } from "./ui.js";

// The title says which copy a message is: the original, a retry or dead-letter copy, or a requeued copy.
export function messageTitle(m) {
  const of = m.topic !== m.origin_topic ? ` of ${m.origin_topic}` : "";
  return `${m.topic} · ${m.kind}${of} · ${m.broker} · queue ${m.queue} · offset ${m.offset}`;
}

function messageView(m) {
  return h("article", { class: `message ${m.kind.replace(/[^a-z]+/g, "-")}` },
    h("h2", {}, messageTitle(m)),
    table([["field", "k"], ["value", "v"]],
      [["msg id", m.msg_id], ["copy", m.kind], ["original topic", m.origin_topic], ["keys", m.keys], ["tags", m.tags],
       ["born", fmtMs(m.born_ms)], ["stored", fmtMs(m.stored_ms)], ["reconsume times", m.reconsume_times],
       ["size", `${m.size} bytes`],
       ...Object.entries(m.properties).map(([k, v]) => [`property ${k}`, v])].map(([k, v]) => ({ k, v })),
      "", { filter: false }),
    h("pre", { class: "body" }, m.body),
    m.body_cut ? note(`${m.body_cut} more bytes not shown`) : null,
    m.body_encoding === "base64" ? note("binary body, shown as base64") : null);
}

export async function messagesPage(page) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const field = (name, placeholder, size = 14) =>
    h("label", {}, name, h("input", { name, placeholder, size, value: params.get(name) || "" }));
  const out = h("div", { id: "message-results" });
  const form = h("form", { class: "inline", id: "message-form", onsubmit: (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const input of form.querySelectorAll("input")) if (input.value) q.set(input.name, input.value);
    location.hash = `#/messages?${q}`;
  } }, field("msg_id", "msg id", 34), field("topic", "topic"), field("key", "message key"), field("broker", "any", 10),
     field("queue", "id", 5), field("offset", "offset", 10), h("button", {}, "Look up"));
  page.replaceChildren(h("h1", {}, "Messages"), note(
    "By msg id (with its retry, dead-letter and requeued copies), by key (last 7 days), or by queue position: " +
    "topic, queue and offset. To browse a topic's newest messages or those from a time, open the topic."), form, out);
  if (!params.get("topic") && !params.get("msg_id")) return;
  const journey = params.get("msg_id") ? journeySection(params) : null;
  try {
    const doc = await api(`/api/messages?${params}`);
    out.replaceChildren(...(journey ? [journey] : []),
      ...(doc.messages.length ? doc.messages.map(messageView) : [note("no message found")]));
  } catch (e) {
    out.replaceChildren(errorBox(e));
  }
}

// A message's journey (as `tidemark message trace` shows it), filled in when the brokers answer.
function journeySection(params) {
  const q = new URLSearchParams({ msg_id: params.get("msg_id") });
  if (params.get("topic")) q.set("topic", params.get("topic"));
  const body = h("div", {}, note("tracing..."));
  const section = h("section", { id: "message-journey" }, h("h2", {}, "Journey"), body);
  api(`/api/messages/trace?${q}`).then((doc) => body.replaceChildren(
    note(doc.trace_id ? `trace id ${doc.trace_id} (traceparent ${doc.traceparent})`
                      : "no trace id: the message carries no traceparent"),
    table([["step", (s) => h("span", { class: `badge ${STEP_BADGES[s.step] || ""}` }, s.step)],
           ["time", (s) => fmtMs(s.at_ms), { sort: (s) => s.at_ms }], ["topic", "topic"], ["queue", "queue"],
           ["group", "group"], ["client", "client"], ["detail", "detail"]],
          doc.steps, "no step", { id: "journey-table", filter: false })),
  (e) => body.replaceChildren(errorBox(e)));
  return section;
}

const STEP_BADGES = { consumed: "ok", failed: "warn", retried: "warn", pending: "", "in-flight": "",
                      "dead-lettered": "bad", requeued: "warn" };

const preview = (m) => (m.body_encoding === "base64" ? `(binary) ${m.body}` : m.body) + (m.body_cut ? " ..." : "");

function messageRows(messages, id) {
  return table([["stored", (m) => fmtMs(m.stored_ms), { sort: (m) => m.stored_ms }], ["broker", "broker"],
                ["queue", "queue", { num: true }], ["offset", "offset", { num: true }],
                ["msg id", (m) => link(`#/messages?msg_id=${enc(m.msg_id)}`, m.msg_id)], ["keys", "keys"],
                ["tags", "tags"], ["copy", "kind"], ["body", preview]], messages, "no message", { id });
}

// The browse box of a topic's page: its newest messages at once, or those stored from a time.
export function browseSection(name) {
  const mode = h("select", { name: "mode" }, h("option", { value: "latest" }, "newest"),
                 h("option", { value: "from" }, "from a time"));
  const count = h("input", { name: "count", type: "number", min: 1, max: 200, value: 20, size: 5 });
  const from = h("input", { name: "from", type: "datetime-local", step: "0.001" });
  const out = h("div", { id: "browse-results" });
  const load = async () => {
    const q = new URLSearchParams();
    if (mode.value === "latest") q.set("latest", count.value);
    else {
      const t = Date.parse(from.value);
      if (Number.isNaN(t)) { out.replaceChildren(errorBox(new Error("pick a time to browse from"))); return; }
      q.set("from", t);
      q.set("limit", count.value);
    }
    out.replaceChildren(note("reading..."));
    try {
      const doc = await api(`/api/topics/${enc(name)}/messages?${q}`);
      out.replaceChildren(note(doc.mode === "latest" ? `the ${doc.messages.length} newest, newest first`
                                                     : `${doc.messages.length} from ${fmtMs(doc.from_ms)}, oldest first`),
                          messageRows(doc.messages, "browse-table"));
    } catch (e) {
      out.replaceChildren(errorBox(e));
    }
  };
  const form = h("form", { class: "inline", id: "browse-form", onsubmit: (ev) => { ev.preventDefault(); load(); } },
    h("label", {}, "show", mode), h("label", {}, "how many", count), h("label", {}, "from (local time)", from),
    h("button", {}, "Browse"));
  return { element: h("div", {}, form, out), load };
}

export async function dlqPage(page, name, session) {
  const doc = await api(`/api/dlq/${enc(name)}`);
  const result = h("div", { id: "requeue-result" });
  const actions = !session.read_only && doc.messages.length;
  const requeue = (body) => planned(result,
    (execute) => api(`/api/dlq/${enc(name)}/requeue`, { ...body, execute }),
    (r) => h("div", {}, note(r.executed ? `${r.requeued.length} message(s) requeued`
                                        : `${r.requeued.length} message(s) would be requeued to their topics`),
             table([["msg id", "msg_id"], ["to topic", "topic"], ["broker", "broker"], ["queue", "queue", { num: true }],
                    ["offset", "offset", { num: true }]], r.requeued, "nothing to requeue", { filter: false })),
    { apply: "Requeue these", done: () => dlqPage(page, name, session).then(() =>
      page.prepend(note("requeued: the list below is up to date", "requeue-done"))) });
  page.replaceChildren(h("h1", {}, `Dead letters of ${name}`), note(doc.topic),
    h("div", { class: "cards" }, card("waiting", doc.waiting, "dlq-waiting"), card("requeued", doc.requeued, "dlq-requeued")),
    note("Requeued: sent back to its topic by an earlier requeue (below the group's requeue mark). " +
         "Requeue all sends the waiting ones."),
    h("p", {}, actions && doc.waiting ? h("button", { id: "requeue-all", onclick: () => requeue({ all: true }) },
                                          "Requeue all waiting") : null),
    result,
    table([["msg id", "msg_id"], ["original topic", "origin_topic"], ["reconsumed", "reconsume_times", { num: true }],
           ["stored", (m) => fmtMs(m.stored_ms), { sort: (m) => m.stored_ms }], ["body", preview],
           ["status", (m) => h("span", { class: `badge ${m.requeued ? "ok" : "warn"}` }, m.requeued ? "requeued" : "waiting")],
           ["", (m) => (actions ? h("button", { class: "secondary", onclick: () => requeue({ msg_id: m.msg_id }) },
                                    m.requeued ? "Requeue again" : "Requeue") : "")]],
          doc.messages, "the dead-letter queue is empty", { id: "dlq-table" }));
}
