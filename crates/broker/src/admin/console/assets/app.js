// kafka-delay's web console. Plain script, no dependencies. Every value from the API is put on
// the page with textContent (never as HTML), and every action is a request to the admin API.
"use strict";

const TOKEN = "kafka-delay-token";
const view = document.getElementById("view");
let refresh = null;
// Counts route()'s renders: a view's read that answers after a newer navigation is dropped, so
// a slow answer never paints over the page the user went to since.
let epoch = 0;

// ---- small helpers ----------------------------------------------------------------------

/** An element with attributes and children; strings become text nodes. */
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    // Inline style attributes are refused by the page's CSP; set the property instead.
    else if (k === "width") e.style.width = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function show(...nodes) {
  view.replaceChildren(...nodes.flat());
}

function iso(ms) {
  return ms ? new Date(ms).toISOString().replace(".000Z", "Z") : "";
}

function ago(ms) {
  const s = Math.round(ms / 1000);
  if (s < 120) return s + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  return Math.round(s / 3600) + " h";
}

function fmt(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en");
}

function outcome(text, error) {
  const o = document.getElementById("outcome");
  o.textContent = text;
  o.className = error ? "error" : "";
  o.hidden = false;
  // Kept through the navigation an action may make next (back to a list, say).
  o.dataset.keep = "1";
}

/** The query of the current hash (#/path?a=b). */
function query() {
  const q = location.hash.split("?")[1] || "";
  return new URLSearchParams(q);
}

function go(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v) q.set(k, v);
  const s = q.toString();
  location.hash = "#" + path + (s ? "?" + s : "");
}

/** A view's read that a newer navigation superseded: route() drops it. */
class Stale extends Error {}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** A request to the admin API, with the token when one was given. */
async function api(method, path, body) {
  const asked = epoch;
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN);
  if (token) headers.Authorization = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
  });
  const data = await r.json().catch(() => ({}));
  if (method === "GET" && asked !== epoch) throw new Stale(path);
  if (r.status === 401) {
    askToken(data.error);
    throw new ApiError(401, data.error || "a token is needed");
  }
  if (!r.ok) throw new ApiError(r.status, data.error || r.statusText);
  return data;
}

/** Asks before an action; resolves true when confirmed. */
function confirmAction(text) {
  const d = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    const yes = document.getElementById("confirm-yes");
    const no = document.getElementById("confirm-no");
    const done = (v) => {
      yes.onclick = no.onclick = null;
      d.close();
      resolve(v);
    };
    yes.onclick = () => done(true);
    no.onclick = () => done(false);
    d.showModal();
  });
}

/** Runs an admin action after confirmation and shows its outcome. */
async function act(question, method, path, body, describe, after) {
  if (!(await confirmAction(question))) return;
  try {
    const r = await api(method, path, body);
    outcome(describe(r));
    if (after) after(r);
  } catch (e) {
    outcome("Refused: " + e.message, true);
  }
}

function table(headers, rows) {
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { class: h.endsWith("#") ? "num" : null }, h.replace(/#$/, ""))))),
    el("tbody", {}, rows.length ? rows : [el("tr", {}, el("td", { colspan: headers.length, class: "muted" }, "Nothing here."))]),
  );
}

function filterForm(fields, values, onSubmit, id) {
  const inputs = {};
  const form = el(
    "form",
    { class: "filters", id },
    fields.map(([name, label, hint]) => {
      inputs[name] = el("input", { name, value: values.get(name) || "", placeholder: hint || "" });
      return el("label", {}, label, inputs[name]);
    }),
    el("button", { type: "submit", class: "primary" }, "Search"),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const out = {};
    for (const [k, i] of Object.entries(inputs)) out[k] = i.value.trim();
    onSubmit(out);
  });
  return form;
}

// ---- sign in ----------------------------------------------------------------------------

function askToken(message) {
  clearInterval(refresh);
  const input = el("input", { type: "password", id: "token", autocomplete: "off", placeholder: "--admin-token" });
  show(
    el("h1", {}, "Admin token"),
    el("p", {}, message || "This broker needs its admin token."),
    el(
      "form",
      {
        class: "filters",
        id: "token-form",
        onsubmit: (e) => {
          e.preventDefault();
          sessionStorage.setItem(TOKEN, input.value);
          route();
        },
      },
      el("label", {}, "Token", input),
      el("button", { type: "submit", class: "primary" }, "Use it"),
    ),
    el("p", { class: "muted" }, "Kept in this tab only (sessionStorage) and sent as a bearer token."),
  );
}

// ---- views ------------------------------------------------------------------------------

async function overview() {
  // The group's sums (every member asked by the instance this page talks to), and this
  // instance's own overview among the members for what does not add up (lateness, minutes).
  const g = await api("GET", "/api/v1/group/overview");
  const self = g.members.map((m) => m.overview).find((v) => v && v.instance.http === g.asked);
  const o = self || (await api("GET", "/api/v1/overview"));
  const several = g.members.length > 1;
  document.getElementById("instance").textContent =
    "instance " + (o.instance.id || "(dynamic member)") + " · group " + o.instance.group + " · v" + o.instance.version;
  const card = (label, value) => el("div", { class: "card" }, el("div", { class: "label" }, label), el("div", { class: "value" }, value));
  const missing = g.members.filter((m) => !m.answered);
  const l = o.lateness_ms;
  const minutes = o.per_minute.slice(-15).reverse();
  const most = Math.max(1, ...minutes.map((m) => Math.max(m.fired, m.dead_lettered)));
  show(
    el("h1", {}, several ? "Overview of the group (" + g.members.length + " instances)" : "Overview"),
    missing.length
      ? el(
          "p",
          { id: "partial", class: "error" },
          "Partial: " + missing.length + " of " + g.members.length + " instances did not answer within " + g.wait_ms / 1000 + " s (" + missing.map((m) => m.http || m.client_id).join(", ") + "); the totals leave them out.",
        )
      : [],
    el(
      "div",
      { class: "cards" },
      card("Pending", fmt(g.pending)),
      card("Oldest overdue", g.oldest_overdue_ms ? ago(g.oldest_overdue_ms) : "none"),
      card("Fired since start", fmt(g.fired_total)),
      card("Dead-lettered since start", fmt(g.dead_lettered_total)),
      card(several ? "Firing lateness p50 / p99, this instance" : "Firing lateness p50 / p99", l.fire_p50 === null ? "–" : "≤ " + l.fire_p50 + " / ≤ " + l.fire_p99 + " ms"),
      card(several ? "Delivery lateness p50 / p99, this instance" : "Delivery lateness p50 / p99", l.delivery_p50 === null ? "–" : "≤ " + l.delivery_p50 + " / ≤ " + l.delivery_p99 + " ms"),
    ),
    el(
      "div",
      { class: "grid2" },
      el(
        "section",
        {},
        el("h2", {}, "Pending by target"),
        table(
          ["Target", "Pending#"],
          g.by_target.map((t) =>
            el("tr", {}, el("td", {}, el("a", { href: "#/pending?target=" + encodeURIComponent(t.target) }, t.target)), el("td", { class: "num" }, fmt(t.pending))),
          ),
        ),
        el("h2", {}, "Pending by due time"),
        table(
          ["Due", "Pending#"],
          g.by_due.map((b) => el("tr", {}, el("td", {}, b.bucket === "overdue" ? "overdue" : b.bucket === "later" ? "later" : "within " + b.bucket), el("td", { class: "num" }, fmt(b.pending)))),
        ),
        g.held.length ? [el("h2", {}, "Held back by fire limits"), table(["Target", "Held#"], g.held.map((h) => el("tr", {}, el("td", {}, h.target), el("td", { class: "num" }, fmt(h.held)))))] : [],
      ),
      el(
        "section",
        {},
        el("h2", {}, several ? "Fired and dead-lettered per minute, this instance" : "Fired and dead-lettered per minute"),
        table(
          ["Minute", "Fired#", "", "Dead-lettered#"],
          minutes.map((m) =>
            el(
              "tr",
              {},
              el("td", {}, iso(m.minute_ms).slice(11, 16)),
              el("td", { class: "num" }, fmt(m.fired)),
              el("td", {}, el("span", { class: "bar", width: Math.round((100 * m.fired) / most) + "px" }), " ", el("span", { class: "bar dead", width: Math.round((100 * m.dead_lettered) / most) + "px" })),
              el("td", { class: "num" }, fmt(m.dead_lettered)),
            ),
          ),
        ),
        el("h2", {}, "Instances"),
        table(
          ["Instance", "Mode", "Version", "Partitions#", "Pending#", "Standby copies#", "Restoring", "Answered"],
          g.members.map((m) => {
            const v = m.overview;
            const moving = v && v.moving;
            return el(
              "tr",
              { class: m.answered ? "" : "missing" },
              el("td", { class: "mono address" }, m.http || m.client_id || "?", m.http === g.asked ? " (this one)" : ""),
              el("td", {}, m.mode || "–"),
              el("td", {}, v ? v.instance.version : "–"),
              el("td", { class: "num" }, m.partitions.length),
              el("td", { class: "num" }, v ? fmt(v.pending) : "–"),
              el("td", { class: "num" }, moving ? (moving.partitions_standby ? fmt(moving.standby_records) + " in " + moving.partitions_standby + " partitions, " + fmt(moving.standby_lag_entries) + " changelog entries behind" : "none") : "–"),
              el("td", {}, moving ? (moving.partitions_restoring ? moving.partitions_restoring + " partitions, " + fmt(moving.restore_remaining_entries) + " entries left" : "none") : "–"),
              el("td", {}, m.answered ? "yes" : m.error),
            );
          }),
        ),
        el("h2", {}, "Ownership"),
        el(
          "p",
          {},
          "This instance (" + (o.instance.id || "dynamic member") + ", " + o.instance.http + ") owns the pending records of " + o.instance.owned_partitions.length + " source partitions:",
        ),
        table(
          ["Source topic", "Partition#"],
          o.instance.owned_partitions.map((p) => el("tr", {}, el("td", {}, p.topic), el("td", { class: "num" }, p.partition))),
        ),
      ),
    ),
  );
}

async function pending() {
  const q = query();
  const params = {};
  for (const k of ["target", "delay_id", "key", "due_from", "due_to", "cursor"]) if (q.get(k)) params[k] = q.get(k);
  const form = filterForm(
    [
      ["delay_id", "delay-id"],
      ["key", "Key"],
      ["target", "Target"],
      ["due_from", "Due from", "RFC 3339 or epoch ms"],
      ["due_to", "Due to", "RFC 3339 or epoch ms"],
    ],
    q,
    (v) => go("/pending", v),
    "pending-search",
  );
  // Every instance's records, merged in due order (the instance asked gathers them).
  const data = await api("GET", "/api/v1/group/pending?" + new URLSearchParams({ ...params, limit: "50" }));
  const filter = { ...params };
  delete filter.cursor;
  const hasFilter = Object.keys(filter).length > 0;
  const reload = () => route();
  const several = data.members.length > 1;
  const missing = data.members.filter((m) => !m.answered);
  // A record held by another instance is named by its ref, which any instance sends on.
  const name = (r) => (r.served_by ? r.ref : r.id);
  const rows = data.records.map((r) =>
    el(
      "tr",
      { "data-id": r.id },
      el("td", {}, el("a", { href: "#/record/" + encodeURIComponent(name(r)) }, el("code", {}, r.id))),
      el("td", {}, iso(r.due_ms)),
      el("td", {}, r.target),
      el("td", { class: "mono" }, r.source.topic + "/" + r.source.partition + "@" + r.source.offset),
      several ? el("td", { class: "mono address" }, r.served_by || "") : [],
      el(
        "td",
        { class: "actions" },
        el("button", { class: "cancel", onclick: () => act("Cancel record " + r.id + " (due " + iso(r.due_ms) + ", target " + r.target + ")? It will never be delivered.", "DELETE", "/api/v1/pending/" + encodeURIComponent(name(r)), undefined, () => "Cancelled " + r.id, reload) }, "Cancel"),
        el("button", { class: "fire", onclick: () => act("Fire record " + r.id + " to " + r.target + " now?", "POST", "/api/v1/pending/" + encodeURIComponent(name(r)) + "/fire", {}, () => "Fired " + r.id + " now (at its turn if a fire limit holds its target)", reload) }, "Fire now"),
      ),
    ),
  );
  // A bulk action's outcome, with the instances it could not reach.
  const across = (verb) => (r) =>
    verb + " " + r.changed + " of " + r.matched + (several ? " on " + r.members.filter((m) => m.answered).length + " of " + r.members.length + " instances" : "") +
    (r.more ? " (more match: repeat)" : "") +
    (r.partial ? "; not applied on " + r.members.filter((m) => !m.answered).map((m) => m.http || m.client_id).join(", ") + ": repeat it" : "");
  const delay = el("input", { id: "bulk-delay", placeholder: "delay, e.g. 10m", value: "" });
  const bulkText = () => Object.entries(filter).map(([k, v]) => k + "=" + v).join(", ");
  const bulk = hasFilter
    ? el(
        "div",
        { class: "bulk actions" },
        el("span", {}, "Every pending record matching " + bulkText() + ":"),
        el("button", { id: "bulk-cancel", onclick: () => act("Cancel every pending record matching " + bulkText() + "?", "POST", "/api/v1/group/bulk/cancel", filter, across("Cancelled"), reload) }, "Cancel all"),
        el("button", { id: "bulk-fire", onclick: () => act("Fire every pending record matching " + bulkText() + " now?", "POST", "/api/v1/group/bulk/fire", filter, across("Fired"), reload) }, "Fire all now"),
        delay,
        el("button", { id: "bulk-reschedule", onclick: () => act("Move every pending record matching " + bulkText() + " to " + delay.value + " from now?", "POST", "/api/v1/group/bulk/reschedule", { ...filter, delay: delay.value }, across("Rescheduled"), reload) }, "Reschedule all"),
      )
    : el("p", { class: "muted" }, "Search to act on every matching record at once.");
  show(
    el("h1", {}, several ? "Pending records of the group (" + data.members.length + " instances)" : "Pending records"),
    missing.length
      ? el("p", { id: "partial", class: "error" }, "Partial: " + missing.map((m) => (m.http || m.client_id) + " (" + m.error + ")").join(", ") + ": its records are not listed.")
      : [],
    form,
    bulk,
    table(several ? ["Id", "Due", "Target", "Source", "Instance", ""] : ["Id", "Due", "Target", "Source", ""], rows),
    data.next_cursor ? el("p", {}, el("a", { id: "next-page", href: "#/pending?" + new URLSearchParams({ ...filter, cursor: data.next_cursor }) }, "Next page →")) : [],
  );
}

function valueView(r) {
  const pre = el("pre", { class: "value", id: "value" });
  const modes = {
    Text: () => (r.value === null ? "(not UTF-8 text: see Hex)" : r.value),
    JSON: () => {
      try {
        return JSON.stringify(JSON.parse(r.value), null, 2);
      } catch (e) {
        return "(not JSON)";
      }
    },
    Hex: () => (r.value_hex || "").replace(/(..)/g, "$1 ").trim(),
  };
  const buttons = Object.keys(modes).map((m) =>
    el("button", {
      type: "button",
      "data-mode": m,
      onclick: (e) => {
        pre.textContent = modes[m]();
        for (const b of buttons) b.setAttribute("aria-pressed", String(b === e.target));
      },
    }, m),
  );
  pre.textContent = modes.Text();
  buttons[0].setAttribute("aria-pressed", "true");
  return [el("div", { class: "tabs" }, buttons), pre];
}

async function record(id) {
  let r;
  try {
    r = await api("GET", "/api/v1/pending/" + encodeURIComponent(id));
  } catch (e) {
    if (e.status !== 404) throw e;
    show(el("h1", {}, "Record " + id), el("p", {}, "Not pending here: it was delivered, cancelled, or is not one of this instance's records. "), el("a", { href: "#/fired" }, "Recently fired →"));
    return;
  }
  const back = () => go("/pending", { target: r.target });
  // Held by another instance (sent on by ref): acted on by its ref too.
  const name = encodeURIComponent(r.served_by ? r.ref : r.id);
  const when = el("input", { id: "reschedule-when", placeholder: "30s, 2h, or an RFC 3339 time" });
  const dd = (label, value) => [el("dt", {}, label), el("dd", {}, value)];
  show(
    el("h1", {}, "Record " + r.id),
    el(
      "dl",
      { class: "detail" },
      dd("Due", iso(r.due_ms) + " (" + (r.due_ms > Date.now() ? "in " + ago(r.due_ms - Date.now()) : ago(Date.now() - r.due_ms) + " ago") + ")"),
      dd("Target", r.target),
      dd("delay-id", r.delay_id === null ? "–" : r.delay_id),
      dd("Key", r.key === null ? "–" : r.key),
      dd("Source", r.source.topic + " partition " + r.source.partition + " offset " + r.source.offset),
      dd("Attempts", (r.headers.find((h) => h.key === "retry-attempt") || {}).value || "0 (not a retry)"),
      dd("Value", (r.value_bytes === null ? "null" : fmt(r.value_bytes) + " bytes")),
      dd("Owner", r.served_by || "this instance"),
    ),
    el(
      "div",
      { class: "bulk actions" },
      el("button", { id: "record-cancel", onclick: () => act("Cancel record " + r.id + "? It will never be delivered.", "DELETE", "/api/v1/pending/" + name, undefined, () => "Cancelled " + r.id, back) }, "Cancel"),
      el("button", { id: "record-fire", onclick: () => act("Fire record " + r.id + " to " + r.target + " now?", "POST", "/api/v1/pending/" + name + "/fire", {}, () => "Fired " + r.id + " now (at its turn if a fire limit holds its target)", back) }, "Fire now"),
      when,
      el("button", {
        id: "record-reschedule",
        onclick: () => {
          const v = when.value.trim();
          const body = /^\d+(ms|s|m|h|d)$/.test(v) ? { delay: v } : { due: v };
          act("Move record " + r.id + " to " + v + "?", "POST", "/api/v1/pending/" + name + "/reschedule", body, (x) => "Rescheduled " + r.id + " to " + iso(x.record.due_ms), () => route());
        },
      }, "Reschedule"),
    ),
    el("h2", {}, "Value"),
    valueView(r),
    el("h2", {}, "Headers"),
    table(["Header", "Value"], r.headers.map((h) => el("tr", {}, el("td", { class: "mono" }, h.key), el("td", { class: "mono" }, h.value === null ? "null" : h.value)))),
  );
}

async function deadLetters(topic) {
  if (!topic) {
    const d = await api("GET", "/api/v1/dead-letters");
    const jobs = await api("GET", "/api/v1/replays");
    show(
      el("h1", {}, "Dead-letter topics"),
      table(
        ["Topic", "Partitions#", "Records#"],
        d.topics.map((t) => el("tr", {}, el("td", {}, el("a", { href: "#/dead-letters/" + encodeURIComponent(t.name) }, t.name)), el("td", { class: "num" }, t.partitions), el("td", { class: "num" }, fmt(t.records)))),
      ),
      replaysTable(jobs.replays),
    );
    return;
  }
  const q = query();
  const filter = {};
  for (const k of ["reason", "target", "key", "header"]) if (q.get(k)) filter[k] = q.get(k);
  const form = filterForm(
    [
      ["reason", "Reason", "e.g. target-not-found"],
      ["target", "Target"],
      ["key", "Key"],
      ["header", "Header", "NAME=VALUE"],
    ],
    q,
    (v) => go("/dead-letters/" + encodeURIComponent(topic), v),
    "dead-search",
  );
  const d = await api("GET", "/api/v1/dead-letters/" + encodeURIComponent(topic) + "?" + new URLSearchParams({ ...filter, limit: "100" }));
  const to = el("input", { id: "replay-to", placeholder: "topic", value: filter.target || "" });
  const rate = el("input", { id: "replay-rate", value: "10/s" });
  const jobs = await api("GET", "/api/v1/replays");
  const filterText = Object.entries(filter).map(([k, v]) => k + "=" + v).join(", ") || "no filter";
  show(
    el("h1", {}, "Dead letters in " + topic),
    form,
    el(
      "div",
      { class: "bulk actions" },
      el("span", {}, "Replay the records matching " + filterText + " to"),
      to,
      el("span", {}, "at"),
      rate,
      el("button", {
        id: "replay",
        class: "primary",
        onclick: () => act("Replay the dead letters of " + topic + " matching " + filterText + " to " + to.value + " at " + rate.value + "?", "POST", "/api/v1/dead-letters/" + encodeURIComponent(topic) + "/replay", { ...filter, to: to.value, rate: rate.value }, (r) => "Replay " + r.replay.id + " started: " + topic + " → " + r.replay.to, () => setTimeout(route, 1000)),
      }, "Replay"),
    ),
    table(
      ["Time", "Reason", "Target", "Key", "Detail", "Value"],
      d.records.map((r) =>
        el(
          "tr",
          { "data-offset": r.partition + "@" + r.offset },
          el("td", {}, iso(r.timestamp_ms)),
          el("td", { class: "mono" }, r.reason || "–"),
          el("td", {}, r.target || "–"),
          el("td", { class: "mono" }, r.key === null ? "–" : r.key),
          el("td", {}, r.detail || ""),
          el("td", { class: "mono" }, r.value === null ? "(binary) " + (r.value_hex || "").slice(0, 64) : r.value.slice(0, 200)),
        ),
      ),
    ),
    replaysTable(jobs.replays),
  );
}

function replaysTable(jobs) {
  return [
    el("h2", {}, "Replays started here"),
    table(
      ["Replay", "From", "To", "Rate", "State", "Moved#", "Skipped#", "Read#"],
      jobs.map((j) =>
        el("tr", { "data-replay": j.id }, el("td", {}, j.id), el("td", {}, j.from), el("td", {}, j.to), el("td", {}, j.rate + "/s"), el("td", { class: "state" }, j.state + (j.error ? ": " + j.error : "")), el("td", { class: "num" }, fmt(j.moved)), el("td", { class: "num" }, fmt(j.skipped)), el("td", { class: "num" }, fmt(j.read) + " of " + fmt(j.total))),
      ),
    ),
  ];
}

async function fired() {
  const q = query();
  const params = {};
  for (const k of ["target", "delay_id", "key"]) if (q.get(k)) params[k] = q.get(k);
  const d = await api("GET", "/api/v1/fired?" + new URLSearchParams({ ...params, limit: "200" }));
  show(
    el("h1", {}, "Recently fired"),
    el("p", { class: "muted" }, "The last " + fmt(d.kept) + " records this instance delivered, kept in memory (not after a restart)."),
    filterForm([["delay_id", "delay-id"], ["key", "Key"], ["target", "Target"]], q, (v) => go("/fired", v), "fired-search"),
    table(
      ["Delivered", "Target", "Key", "delay-id", "Due", "Late ms#"],
      d.records.map((r) =>
        el("tr", { "data-id": r.id }, el("td", {}, iso(r.acked_ms)), el("td", {}, r.target), el("td", { class: "mono" }, r.key === null ? "–" : r.key), el("td", { class: "mono" }, r.delay_id === null ? "–" : r.delay_id), el("td", {}, iso(r.due_ms)), el("td", { class: "num" }, fmt(r.fired_ms - r.due_ms))),
      ),
    ),
  );
}

// ---- routing ----------------------------------------------------------------------------

async function route() {
  clearInterval(refresh);
  epoch += 1;
  const path = (location.hash.slice(1) || "/").split("?")[0];
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const name = parts[0] || "overview";
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.view === (name === "record" ? "pending" : name));
  document.getElementById("sign-out").hidden = !sessionStorage.getItem(TOKEN);
  try {
    if (name === "overview") {
      await overview();
      // One refresh timer, cleared by the next route; it redraws only while the overview shows.
      refresh = setInterval(() => {
        if ((location.hash.slice(1) || "/").split("?")[0] === "/") overview().catch(() => {});
      }, 5000);
    }
    else if (name === "pending") await pending();
    else if (name === "record") await record(parts[1]);
    else if (name === "dead-letters") await deadLetters(parts[1]);
    else if (name === "fired") await fired();
    else show(el("h1", {}, "Not found"), el("a", { href: "#/" }, "Overview"));
  } catch (e) {
    if (e instanceof Stale) return;
    if (e.status !== 401) show(el("h1", {}, "Error"), el("p", { id: "error" }, e.message));
  }
}

document.getElementById("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN);
  route();
});
window.addEventListener("hashchange", () => {
  const o = document.getElementById("outcome");
  if (o.dataset.keep === "1") o.dataset.keep = "";
  else o.hidden = true;
  route();
});
route();
