// Management: creating and deleting topics, users and ACL rules. Each change is planned first (the
// server answers what would change and changes nothing) and made only when Apply is clicked, as the CLI
// changes nothing without --execute. The brokers' ACLs decide whether the signed-in user may.

import { api, enc, facts, h, note, planned, table } from "./ui.js";

const list = (xs) => (xs && xs.length ? xs.join(", ") : "-");

export function topicCreateForm(onDone) {
  const name = h("input", { name: "topic", placeholder: "topic name", size: 20 });
  const queues = h("input", { name: "queues", type: "number", min: 1, max: 1024, value: 4, size: 5 });
  const brokers = h("input", { name: "brokers", placeholder: "all", size: 16 });
  const out = h("div", { id: "topic-create-result" });
  const call = (execute) => api("/api/topics", {
    topic: name.value, queues: Number.parseInt(queues.value, 10), execute,
    brokers: brokers.value.split(",").map((b) => b.trim()).filter(Boolean) });
  const render = (d) => facts([["topic", d.topic], ["queues per broker", d.queues], ["on brokers", list(d.brokers)],
                               ["", d.executed ? "created" : "would be created"]]);
  return h("div", {},
    h("form", { class: "inline", id: "topic-create", onsubmit: (ev) => {
      ev.preventDefault();
      planned(out, call, render, { apply: "Create topic", done: onDone });
    } }, h("label", {}, "topic", name), h("label", {}, "queues", queues), h("label", {}, "brokers (comma-separated)", brokers),
      h("button", {}, "Plan creation")),
    out);
}

export function topicDeleteSection(name, onDone) {
  const out = h("div", { id: "topic-delete-result" });
  const call = (execute, extra) => api(`/api/topics/${enc(name)}/delete`, { execute, ...extra });
  const render = (d) => h("div", {},
    facts([["topic", d.topic], ["on brokers", list(d.brokers)], ["queues", d.queues], ["messages", d.messages],
           ["groups losing their offsets", list(d.groups)], ["", d.executed ? "deleted" : "would be deleted"]]),
    d.live_consumers.length && !d.executed
      ? h("p", { class: "error", role: "alert" }, `used by ${d.live_consumers.length} live consumer(s): ${d.live_consumers.join("; ")}`)
      : null);
  return h("div", {},
    h("button", { class: "danger", id: "topic-delete", onclick: async () => {
      await planned(out, call, render, { apply: "Delete topic", also: [["Delete anyway (force)", { force: true }]], done: onDone });
    } }, "Plan deletion"),
    out);
}

// -- users and ACL rules ------------------------------------------------------------------------

export async function usersPage(page, session, flash = "") {
  const [users, rules] = await Promise.all([api("/api/users"), api("/api/acls")]);
  const out = h("div", { id: "users-result" });
  const reload = (d) => usersPage(page, session, d.executed ? "done: the lists below are up to date" : "");
  const act = !session.read_only;
  const deleteUser = (u) => planned(out, (execute) => api(`/api/users/${enc(u.user)}/delete`, { execute }),
    (d) => h("div", {}, facts([["user", d.user], ["super user", d.super_user ? "yes" : "no"],
                               ["", d.executed ? "deleted" : "would be deleted"]]),
             note(`with its ${d.rules.length} ACL rule(s)`)), { apply: "Delete user", done: reload });
  const deleteRule = (r) => planned(out, (execute) => api("/api/acls/delete", { user: r.user, resource: r.resource, execute }),
    (d) => h("div", {}, note(`${d.rules.length} rule(s) of ${d.user} ${d.executed ? "deleted" : "would be deleted"}`),
             ruleTable(d.rules, null)), { apply: "Delete rule", done: reload });
  const ruleTable = (rows, id) => table([["user", "user"], ["resource", "resource"], ["actions", (r) => r.actions.join(", ")],
    ["decision", "decision"], ["source IPs", (r) => list(r.source_ips)], ["brokers", (r) => list(r.brokers)],
    ["", (r) => (act && id ? h("button", { class: "secondary", onclick: () => deleteRule(r) }, "Delete") : "")]],
  rows, "no ACL rule", { id, filter: Boolean(id) });

  page.replaceChildren(h("h1", {}, "Users and ACL rules"), flash ? note(flash, "users-done") : null, out,
    h("h2", {}, "Users"),
    table([["user", "user"], ["super user", (u) => (u.super_user ? "yes" : "no")], ["brokers", (u) => list(u.brokers)],
           ["", (u) => (act ? h("button", { class: "secondary", onclick: () => deleteUser(u) }, "Delete") : "")]],
          users.users, "no user", { id: "users-table" }),
    act ? userForm(out, reload) : null,
    h("h2", {}, "ACL rules"),
    ruleTable(rules.rules, "acls-table"),
    act ? ruleForm(out, reload) : note("the console is read-only"));
}

function userForm(out, reload) {
  const name = h("input", { name: "name", placeholder: "access key", size: 14 });
  const secret = h("input", { name: "new_secret", type: "password", placeholder: "secret key", size: 14,
                              autocomplete: "new-password" });
  const superUser = h("input", { name: "super_user", type: "checkbox" });
  return h("form", { class: "inline", id: "user-create", onsubmit: (ev) => {
    ev.preventDefault();
    planned(out, (execute) => api("/api/users", { name: name.value, secret_key: secret.value,
                                                  super_user: superUser.checked, execute }),
      (d) => facts([["user", d.user], ["super user", d.super_user ? "yes" : "no"], ["on brokers", list(d.brokers)],
                    ["", d.executed ? "created" : "would be created"]]), { apply: "Create user", done: reload });
  } }, h("label", {}, "new user", name), h("label", {}, "secret key", secret), h("label", {}, "super user", superUser),
    h("button", {}, "Plan user"));
}

function ruleForm(out, reload) {
  const user = h("input", { name: "rule_user", placeholder: "user", size: 12 });
  const resource = h("input", { name: "resource", placeholder: "Topic:Orders, Group:g*, Cluster", size: 24 });
  const actions = h("input", { name: "actions", placeholder: "Pub,Sub,Get,List", size: 16 });
  const decision = h("select", { name: "decision" }, h("option", {}, "Allow"), h("option", {}, "Deny"));
  return h("form", { class: "inline", id: "acl-create", onsubmit: (ev) => {
    ev.preventDefault();
    planned(out, (execute) => api("/api/acls", { user: user.value, resource: resource.value, actions: actions.value,
                                                 decision: decision.value, execute }),
      (d) => facts([["user", d.user], ["resource", d.resource], ["actions", d.actions.join(", ")],
                    ["decision", d.decision], ["on brokers", list(d.brokers)],
                    ["", d.executed ? "added" : "would be added"]]), { apply: "Add rule", done: reload });
  } }, h("label", {}, "user", user), h("label", {}, "resource", resource), h("label", {}, "actions", actions),
    h("label", {}, "decision", decision), h("button", {}, "Plan rule"));
}
