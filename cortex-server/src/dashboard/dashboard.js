// The cortex dashboard: plain JavaScript over the server's own JSON API
// (/v1/jobs, /v1/metrics, /v1/files, /v1/batches). No build step, no
// third-party code. Views are chosen by the URL's hash; each polls its
// endpoint while shown, so the page follows the queue without reloading.
"use strict";

const POLL_MS = 1500;
const ITEMS_PER_PAGE = 50;
const JOBS_PER_PAGE = 25;
const KEY_STORE = "cortex-api-key";
const main = document.getElementById("main");
let timer = null;
let view = 0; // bumped on each navigation: late answers of an old view are dropped

// ---- DOM helpers (text goes in as text, never as HTML) ----

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "className") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) el.setAttribute(name, String(value));
  return el;
}

function fmtNumber(n, digits = 0) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}
function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  seconds = Math.max(0, Math.round(seconds));
  if (seconds < 60) return seconds + "s";
  if (seconds < 3600) return Math.floor(seconds / 60) + "m " + (seconds % 60) + "s";
  if (seconds < 86400) return Math.floor(seconds / 3600) + "h " + Math.floor((seconds % 3600) / 60) + "m";
  return Math.floor(seconds / 86400) + "d " + Math.floor((seconds % 86400) / 3600) + "h";
}
function fmtBytes(b) {
  if (b === null || b === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return fmtNumber(b, i ? 1 : 0) + " " + units[i];
}
function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms < 1000 ? ms + " ms" : fmtNumber(ms / 1000, 2) + " s";
}
function age(ms) { return fmtDuration((Date.now() - ms) / 1000); }
function stateBadge(state) { return h("span", { className: "state state-" + state }, state.replace("_", " ")); }
function live(text) { document.getElementById("live").textContent = text; }

// ---- The API, with the key when the server wants one ----

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) headers["Authorization"] = "Bearer " + key;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status === 401) {
    sessionStorage.removeItem(KEY_STORE);
    await askForKey(key ? "That key was refused. Enter another." : null);
    return api(path, options);
  }
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try {
      const body = await response.json();
      message = (body.error && body.error.message) || body.error || message;
    } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, message);
  }
  return options.raw ? response : response.json();
}

let keyPrompt = null;
function askForKey(why) {
  if (keyPrompt) return keyPrompt;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  if (why) document.getElementById("key-why").textContent = why;
  keyPrompt = new Promise((resolve) => {
    document.getElementById("key-form").onsubmit = () => {
      sessionStorage.setItem(KEY_STORE, input.value.trim());
      input.value = "";
      keyPrompt = null;
      resolve();
    };
  });
  if (!dialog.open) dialog.showModal();
  input.focus();
  return keyPrompt;
}

// ---- Small charts in SVG ----

function lineChart(values, { max, color = "#0a58ca", bars = false } = {}) {
  const width = 300, height = 110, pad = 4;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", preserveAspectRatio: "none" });
  const top = Math.max(max ?? 0, ...values, 1e-9);
  svg.append(s("line", { x1: 0, y1: height - pad, x2: width, y2: height - pad, stroke: "#d0d7de" }));
  if (values.length === 0) return svg;
  if (bars) {
    const w = width / values.length;
    values.forEach((v, i) => {
      const bh = (v / top) * (height - 2 * pad);
      svg.append(s("rect", { x: i * w + 0.5, y: height - pad - bh, width: Math.max(w - 1, 0.5), height: bh, fill: color }));
    });
    return svg;
  }
  const step = values.length > 1 ? width / (values.length - 1) : 0;
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(height - pad - (v / top) * (height - 2 * pad)).toFixed(1)}`);
  svg.append(s("polyline", { points: points.join(" "), fill: "none", stroke: color, "stroke-width": 2 }));
  return svg;
}

function chart(title, value, svg, note, label) {
  svg.setAttribute("aria-label", label || title);
  return h("figure", { className: "chart" },
    h("h3", {}, title), h("div", { className: "value" }, value), svg,
    note ? h("div", { className: "note" }, note) : null);
}

function progressBar(counts) {
  const total = counts.total || 1;
  const bar = h("div", {
    className: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": counts.total,
    "aria-valuenow": counts.completed + counts.failed + counts.cancelled,
    "aria-label": `${counts.completed} completed, ${counts.failed} failed, ${counts.running} running, ${counts.pending} pending of ${counts.total}`,
  });
  for (const part of ["completed", "failed", "cancelled", "running"]) {
    const span = h("span", { className: part });
    span.style.width = (100 * counts[part] / total).toFixed(2) + "%";
    bar.append(span);
  }
  return h("div", {}, bar, h("div", { className: "bar-label" },
    `${fmtNumber(counts.completed)} completed · ${fmtNumber(counts.failed)} failed · ${fmtNumber(counts.running)} running · ${fmtNumber(counts.pending)} pending`));
}

function legend() {
  const entry = (name, color) => { const i = h("i", {}); i.style.background = color; return h("span", {}, i, name); };
  return h("div", { className: "legend" }, entry("completed", "#1a7f37"), entry("failed", "#cf222e"),
    entry("cancelled", "#bf8700"), entry("running", "#0a58ca"), entry("pending", "#eaeef2"));
}

// ---- Navigation ----

function route() {
  view++;
  if (timer) { clearTimeout(timer); timer = null; }
  const hash = location.hash || "#/";
  const job = hash.match(/^#\/jobs\/(\d+)/);
  const onServer = hash.startsWith("#/server");
  for (const [id, current] of [["nav-jobs", !onServer], ["nav-server", onServer]]) {
    const link = document.getElementById(id);
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (job) return showJob(Number(job[1]));
  if (onServer) return showServer();
  return showJobs();
}

/// Runs `load` now and every POLL_MS while this view is shown.
function poll(load) {
  const mine = view;
  const tick = async () => {
    if (mine !== view) return;
    try {
      await load(mine);
      if (mine === view) live("Live · updated " + new Date().toLocaleTimeString());
    } catch (error) {
      if (mine === view) live("Not updated: " + error.message);
    }
    if (mine === view) timer = setTimeout(tick, POLL_MS);
  };
  return tick();
}

function replace(target, node) { target.replaceChildren(node); }

// ---- Jobs ----

const jobsFilter = { state: "", model: "", offset: 0 };

function showJobs() {
  document.title = "Jobs · cortex";
  const stateSelect = h("select", { id: "filter-state" },
    ["", "in_progress", "completed", "failed", "cancelling", "cancelled", "expired"].map((v) =>
      h("option", { value: v, selected: v === jobsFilter.state }, v ? v.replace("_", " ") : "any state")));
  const modelSelect = h("select", { id: "filter-model" }, h("option", { value: "" }, "any model"));
  const table = h("div", { className: "table-wrap", id: "jobs" });
  const pager = h("div", { className: "pager" });
  const rejected = h("div", { id: "rejected" });
  const refilter = () => { jobsFilter.state = stateSelect.value; jobsFilter.model = modelSelect.value; jobsFilter.offset = 0; poll(load); };
  stateSelect.addEventListener("change", () => { view++; refilter(); });
  modelSelect.addEventListener("change", () => { view++; refilter(); });
  main.replaceChildren(
    h("h1", {}, "Jobs"),
    uploadPanel(),
    h("div", { className: "row" },
      h("div", {}, h("label", { for: "filter-state" }, "State"), stateSelect),
      h("div", {}, h("label", { for: "filter-model" }, "Model"), modelSelect)),
    legend(), table, pager, rejected);

  async function load(mine) {
    const q = new URLSearchParams({ offset: jobsFilter.offset, limit: JOBS_PER_PAGE });
    if (jobsFilter.state) q.set("state", jobsFilter.state);
    if (jobsFilter.model) q.set("model", jobsFilter.model);
    const list = await api("/v1/jobs?" + q);
    if (mine !== view) return;
    const known = [...modelSelect.options].map((o) => o.value);
    for (const m of list.models) if (!known.includes(m)) modelSelect.append(h("option", { value: m, selected: m === jobsFilter.model }, m));
    replace(table, jobsTable(list.data));
    rejected.replaceChildren(...rejectedFiles(list.rejected));
    pager.replaceChildren(...pagerControls(list.matching, jobsFilter.offset, JOBS_PER_PAGE, (offset) => { jobsFilter.offset = offset; view++; poll(load); }, "jobs"));
  }
  return poll(load);
}

function pagerControls(matching, offset, per, go, what) {
  const last = Math.max(0, Math.ceil(matching / per) - 1);
  const page = Math.floor(offset / per);
  return [
    h("button", { className: "secondary", disabled: page <= 0, onclick: () => go(Math.max(0, offset - per)), "aria-label": "Previous page of " + what }, "← Previous"),
    h("span", { "aria-live": "polite" }, matching ? `${fmtNumber(offset + 1)}–${fmtNumber(Math.min(offset + per, matching))} of ${fmtNumber(matching)} ${what}` : `no ${what}`),
    h("button", { className: "secondary", disabled: page >= last, onclick: () => go(offset + per), "aria-label": "Next page of " + what }, "Next →"),
  ];
}

function jobsTable(jobs) {
  if (jobs.length === 0) return h("p", { className: "muted" }, "No jobs yet. Start one above, or with `cortex submit`.");
  return h("table", {},
    h("thead", {}, h("tr", {},
      h("th", {}, "Job"), h("th", {}, "State"), h("th", { className: "hide-narrow" }, "Model"), h("th", {}, "Progress"),
      h("th", { className: "num" }, "Tokens/s"), h("th", { className: "num" }, "ETA"), h("th", { className: "num hide-narrow" }, "Age"),
      h("th", { className: "hide-narrow" }, "Metadata"))),
    h("tbody", {}, jobs.map((status) => {
      const job = status.job;
      const open = () => { location.hash = "#/jobs/" + job.id; };
      return h("tr", { className: "clickable", tabindex: 0, "data-job": job.id, onclick: open, onkeydown: (e) => { if (e.key === "Enter") open(); } },
        h("td", {}, h("a", { href: "#/jobs/" + job.id }, "#" + job.id), " ", h("span", { className: "muted" }, job.source_name)),
        h("td", {}, stateBadge(job.state)),
        h("td", { className: "hide-narrow" }, job.model),
        h("td", {}, progressBar(job.counts)),
        h("td", { className: "num" }, fmtNumber(status.tokens_per_second, 1)),
        h("td", { className: "num" }, fmtDuration(status.eta_seconds)),
        h("td", { className: "num hide-narrow" }, age(job.times.created_at)),
        h("td", { className: "hide-narrow" }, Object.entries(job.metadata).map(([k, v]) => `${k}=${v}`).join(", ")));
    })));
}

/// Batches refused for bad lines: they never became jobs.
function rejectedFiles(batches) {
  if (batches.length === 0) return [];
  const lines = (batch) => {
    const errors = (batch.errors && batch.errors.data) || [];
    const shown = errors.slice(0, 3).map((e) => h("li", {}, e.line ? `line ${e.line}: ${e.message}` : e.message));
    if (errors.length > 3) shown.push(h("li", {}, `and ${errors.length - 3} more`));
    return h("ul", { className: "errors" }, shown);
  };
  return [
    h("h2", {}, "Refused files"),
    h("p", { className: "muted" }, "Batches refused for bad lines: nothing of them was submitted."),
    h("div", { className: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "Batch"), h("th", { className: "hide-narrow" }, "Input file"), h("th", { className: "num" }, "Age"), h("th", {}, "Errors"))),
      h("tbody", {}, batches.map((batch) => h("tr", { "data-batch": batch.id },
        h("td", {}, batch.id), h("td", { className: "hide-narrow" }, batch.input_file_id),
        h("td", { className: "num" }, age(batch.created_at * 1000)), h("td", {}, lines(batch))))))),
  ];
}

// ---- Starting a job: the Files and Batches API underneath ----

function uploadPanel() {
  const file = h("input", { type: "file", id: "upload-file", accept: ".jsonl,application/jsonl,application/x-ndjson,text/plain", required: true });
  const endpoint = h("select", { id: "upload-endpoint" },
    ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"].map((e) => h("option", { value: e }, e)));
  // OpenAI's Batch API needs a window; what has not finished in it expires.
  const window_ = h("input", { type: "text", id: "upload-window", value: "24h", size: 6, required: true,
    pattern: "([0-9.]+(ms|s|m|h|d))+", title: "a duration: 24h, 90m, 1h30m, 7d" });
  const outcome = h("div", { id: "upload-outcome", "aria-live": "polite" });
  const button = h("button", { type: "submit", id: "upload-submit" }, "Start job");
  const form = h("form", { className: "panel", id: "upload-form" },
    h("h2", {}, "Start a job"),
    h("div", { className: "row" },
      h("div", {}, h("label", { for: "upload-file" }, "JSONL file (OpenAI Batch lines or cortex lines)"), file),
      h("div", {}, h("label", { for: "upload-endpoint" }, "Endpoint"), endpoint),
      h("div", {}, h("label", { for: "upload-window" }, "Completion window"), window_),
      button),
    outcome);
  file.addEventListener("change", async () => {
    // The endpoint the file's first line names, as OpenAI's Batch API asks.
    const first = file.files[0] ? (await file.files[0].slice(0, 65536).text()).split("\n").find((l) => l.trim()) : null;
    try { const url = first && JSON.parse(first).url; if (url && [...endpoint.options].some((o) => o.value === url)) endpoint.value = url; } catch (_) { /* the server says what is wrong */ }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!file.files[0]) return;
    button.disabled = true;
    outcome.replaceChildren(h("p", {}, "Uploading…"));
    try {
      const body = new FormData();
      body.append("purpose", "batch");
      body.append("file", file.files[0], file.files[0].name);
      const uploaded = await api("/v1/files", { method: "POST", body });
      const batch = await api("/v1/batches", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ input_file_id: uploaded.id, endpoint: endpoint.value, completion_window: window_.value.trim() }),
      });
      if (batch.status === "failed") {
        const errors = (batch.errors && batch.errors.data) || [];
        outcome.replaceChildren(
          h("p", { className: "errors", role: "alert" }, `${file.files[0].name}: ${errors.length} invalid line${errors.length === 1 ? "" : "s"}; nothing was submitted`),
          h("ul", { className: "errors", id: "upload-errors" }, errors.map((e) => h("li", {}, e.line ? `line ${e.line}: ${e.message}` : e.message))));
      } else {
        const id = batch.id.replace("batch_", "");
        outcome.replaceChildren(h("p", { className: "ok", role: "status" }, "Started ", h("a", { href: "#/jobs/" + id, id: "started-job" }, "job #" + id)));
        file.value = "";
      }
    } catch (error) {
      outcome.replaceChildren(h("p", { className: "errors", role: "alert" }, error.message));
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

// ---- One job ----

const itemsFilter = { state: "", text: "", offset: 0, job: null, open: null };

function showJob(id) {
  document.title = `Job ${id} · cortex`;
  if (itemsFilter.job !== id) Object.assign(itemsFilter, { state: "", text: "", offset: 0, job: id, open: null });
  const header = h("div", { id: "job-header" });
  const charts = h("div", { className: "charts", id: "job-charts" });
  const stateSelect = h("select", { id: "items-state" },
    ["", "pending", "running", "completed", "failed", "cancelled"].map((v) => h("option", { value: v, selected: v === itemsFilter.state }, v || "any state")));
  const search = h("input", { type: "search", id: "items-search", value: itemsFilter.text, placeholder: "custom_id contains…" });
  const items = h("div", { className: "table-wrap", id: "items" });
  const pager = h("div", { className: "pager" });
  const detail = h("div", { id: "item-detail" });
  const refresh = () => { view++; itemsFilter.offset = 0; poll(load); };
  stateSelect.addEventListener("change", () => { itemsFilter.state = stateSelect.value; refresh(); });
  let typing = null;
  search.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(() => { itemsFilter.text = search.value; refresh(); }, 250); });
  main.replaceChildren(
    h("p", {}, h("a", { href: "#/" }, "← All jobs")),
    header, charts,
    h("h2", {}, "Items"),
    h("div", { className: "row" },
      h("div", {}, h("label", { for: "items-state" }, "State"), stateSelect),
      h("div", {}, h("label", { for: "items-search" }, "Search custom_id"), search)),
    detail, items, pager);

  async function load(mine) {
    const q = new URLSearchParams({ offset: itemsFilter.offset, limit: ITEMS_PER_PAGE });
    if (itemsFilter.state) q.set("state", itemsFilter.state);
    if (itemsFilter.text) q.set("custom_id", itemsFilter.text);
    const [status, page] = await Promise.all([api(`/v1/jobs/${id}`), api(`/v1/jobs/${id}/items?` + q)]);
    if (mine !== view) return;
    header.replaceChildren(jobHeader(status, () => { view++; poll(load); }));
    charts.replaceChildren(...jobCharts(status));
    items.replaceChildren(itemsTable(page.data, (line) => openItem(id, line, detail)));
    pager.replaceChildren(...pagerControls(page.matching, itemsFilter.offset, ITEMS_PER_PAGE, (offset) => { itemsFilter.offset = offset; view++; poll(load); }, "items"));
    if (itemsFilter.open !== null && !detail.dataset.line) openItem(id, itemsFilter.open, detail);
  }
  return poll(load);
}

function jobHeader(status, reload) {
  const job = status.job;
  const c = job.counts;
  const act = (name, label, enabled) => h("button", {
    id: "action-" + name, className: name === "cancel" ? "secondary" : "", disabled: !enabled,
    onclick: async (event) => {
      event.target.disabled = true;
      try { await api(`/v1/jobs/${job.id}/${name}`, { method: "POST" }); reload(); }
      catch (error) { alert(error.message); event.target.disabled = false; }
    },
  }, label);
  const terminal = ["completed", "failed", "cancelled", "expired"].includes(job.state);
  const download = (part, label) => h("button", {
    id: "download-" + part, className: "secondary", disabled: !status[part + "_file_id"],
    onclick: () => downloadFile(status[part + "_file_id"], `batch_${job.id}_${part}.jsonl`),
  }, label);
  return h("section", { "aria-labelledby": "job-title" },
    h("h1", { id: "job-title" }, `Job #${job.id} `, stateBadge(job.state), " ", h("span", { className: "muted" }, job.source_name)),
    progressBar(c),
    h("div", { className: "stats" },
      stat("Items", fmtNumber(c.total)), stat("Completed", fmtNumber(c.completed)), stat("Failed", fmtNumber(c.failed)),
      stat("Tokens/s (last minute)", fmtNumber(status.tokens_per_second, 1)), stat("ETA", fmtDuration(status.eta_seconds)),
      stat("Generated tokens", fmtNumber(job.completion_tokens + (status.running_tokens || 0))),
      job.times.expires_at && !terminal ? stat("Window ends", new Date(job.times.expires_at).toLocaleString()) : null, stat("Model", job.model), stat("Age", age(job.times.created_at))),
    Object.keys(job.metadata).length ? h("p", { className: "muted" }, "Metadata: " + Object.entries(job.metadata).map(([k, v]) => `${k}=${v}`).join(", ")) : null,
    h("div", { className: "actions" },
      act("cancel", "Cancel", !terminal && job.state !== "cancelling"),
      act("resume", "Resume", ["cancelled", "failed", "cancelling", "expired"].includes(job.state)),
      act("retry", "Retry failed", c.failed - c.invalid > 0 && job.state !== "cancelling"),
      download("output", "Download output"), download("error", "Download errors")));
}

function stat(label, value) { return h("div", { className: "stat" }, h("b", {}, value), h("span", {}, label)); }

function jobCharts(status) {
  const a = status.activity;
  const perSecond = a.bucket_ms / 1000;
  const tokens = a.buckets.map((b) => b.tokens / perSecond);
  let done = 0;
  const cumulative = a.buckets.map((b) => (done += b.completed));
  const dist = (d) => d.count ? `p50 ${fmtMs(d.p50)} · p90 ${fmtMs(d.p90)} · p99 ${fmtMs(d.p99)} · max ${fmtMs(d.max)}` : "no results yet";
  return [
    chart("Throughput", fmtNumber(tokens.length ? tokens[tokens.length - 1] : 0, 1) + " tokens/s", lineChart(tokens), `per ${fmtDuration(perSecond)} over the job's life`, "Tokens per second over the job's life"),
    chart("Completed items", fmtNumber(done), lineChart(cumulative, { color: "#1a7f37" }), "over the job's life", "Completed items over the job's life"),
    chart("Time to first token", fmtMs(a.first_token_ms.p50) + " median", lineChart(a.first_token_ms.histogram, { bars: true, color: "#8250df" }), dist(a.first_token_ms), "Distribution of time to first token"),
    chart("Item latency", fmtMs(a.duration_ms.p50) + " median", lineChart(a.duration_ms.histogram, { bars: true, color: "#bf3989" }), dist(a.duration_ms), "Distribution of per-item latency"),
  ];
}

function itemsTable(items, open) {
  if (items.length === 0) return h("p", { className: "muted" }, "No items match.");
  return h("table", { id: "items-table" },
    h("thead", {}, h("tr", {}, h("th", { className: "num" }, "Line"), h("th", {}, "custom_id"), h("th", {}, "State"),
      h("th", { className: "num" }, "Attempts"), h("th", { className: "num hide-narrow" }, "Tokens"), h("th", { className: "num hide-narrow" }, "Latency"),
      h("th", {}, "Error"))),
    h("tbody", {}, items.map((item) => {
      const show = () => open(item.line);
      return h("tr", { className: "clickable", tabindex: 0, "data-line": item.line, onclick: show, onkeydown: (e) => { if (e.key === "Enter") show(); } },
        h("td", { className: "num" }, item.line), h("td", {}, item.custom_id), h("td", {}, stateBadge(item.state)),
        h("td", { className: "num" }, item.attempts), h("td", { className: "num hide-narrow" }, item.completion_tokens ?? "–"),
        h("td", { className: "num hide-narrow" }, fmtMs(item.duration_ms)), h("td", {}, item.error_code ? `${item.error_code}: ${item.error_message || ""}` : ""));
    })));
}

async function openItem(job, line, target) {
  itemsFilter.open = line;
  target.dataset.line = line;
  try {
    const item = await api(`/v1/jobs/${job}/items/${line}`);
    const response = item.response;
    const output = response && response.completions ? response.completions.map((c) => c.text).join("\n---\n")
      : response && response.embeddings ? `${response.embeddings.length} embedding(s)` : null;
    target.replaceChildren(h("section", { className: "detail", id: "item", "aria-labelledby": "item-title", tabindex: -1 },
      h("h2", { id: "item-title" }, `Line ${item.line}: ${item.custom_id} `, stateBadge(item.state)),
      h("div", { className: "stats" },
        stat("Attempts", item.attempts), stat("Ran on", item.ran_by || "–"), stat("Latency", fmtMs(item.duration_ms)),
        stat("Tokens", item.completion_tokens ?? "–"), stat("Endpoint", item.endpoint)),
      item.error_code ? h("div", {}, h("h3", {}, "Error"), h("pre", { id: "item-error" }, `${item.error_code}: ${item.error_message || ""}`)) : null,
      output !== null ? h("div", {}, h("h3", {}, "Output"), h("pre", { id: "item-output" }, output)) : null,
      h("h3", {}, "Request"), h("pre", { id: "item-request" }, JSON.stringify(item.request, null, 2)),
      h("button", { className: "secondary", onclick: () => { itemsFilter.open = null; delete target.dataset.line; target.replaceChildren(); } }, "Close")));
    target.firstChild.focus();
  } catch (error) {
    target.replaceChildren(h("p", { className: "errors", role: "alert" }, error.message));
  }
}

async function downloadFile(fileId, name) {
  try {
    const response = await api(`/v1/files/${fileId}/content`, { raw: true });
    const url = URL.createObjectURL(await response.blob());
    const link = h("a", { href: url, download: name });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  } catch (error) {
    alert(error.message);
  }
}

// ---- The server ----

const history = [];
const HISTORY = 120;

function showServer() {
  document.title = "Server · cortex";
  const body = h("div", { id: "server" });
  main.replaceChildren(h("h1", {}, "Server"), body);
  async function load(mine) {
    let m;
    try {
      m = await api("/v1/metrics");
    } catch (error) {
      if (error.status === 403) {
        body.replaceChildren(h("p", { className: "notice" }, "The server's figures need an admin key: " + error.message));
        return;
      }
      throw error;
    }
    if (mine !== view) return;
    const previous = history[history.length - 1];
    const seconds = previous ? (m.time - previous.time) / 1000 : 0;
    const rate = previous && seconds > 0 ? Math.max(0, (m.engine.generated_tokens - previous.engine.generated_tokens) / seconds) : 0;
    history.push(Object.assign(m, { rate }));
    if (history.length > HISTORY) history.shift();
    body.replaceChildren(...serverView(m));
  }
  return poll(load);
}

function serverView(m) {
  const series = (pick) => history.map(pick);
  const q = m.queue.items;
  const sys = m.system;
  const memUsed = sys.machine_memory_total_bytes != null ? sys.machine_memory_total_bytes - sys.machine_memory_available_bytes : null;
  const charts = [
    chart("Running sequences", fmtNumber(m.engine.running_sequences), lineChart(series((x) => x.engine.running_sequences))),
    chart("KV cache use", fmtNumber(100 * m.engine.kv_utilisation_ratio, 1) + " %", lineChart(series((x) => 100 * x.engine.kv_utilisation_ratio), { max: 100, color: "#8250df" })),
    chart("Generated tokens/s", fmtNumber(m.rate, 1), lineChart(series((x) => x.rate), { color: "#1a7f37" })),
    chart("Queue depth", fmtNumber(q.pending + q.running) + " items", lineChart(series((x) => x.queue.items.pending + x.queue.items.running), { color: "#bf8700" }), `${fmtNumber(q.pending)} pending · ${fmtNumber(q.running)} running`),
    chart("Machine CPU", sys.machine_cpu_utilisation_ratio == null ? "–" : fmtNumber(100 * sys.machine_cpu_utilisation_ratio, 0) + " %",
      lineChart(series((x) => 100 * (x.system.machine_cpu_utilisation_ratio || 0)), { max: 100 }), `cortex: ${fmtNumber(sys.process_cpu_cores, 2)} of ${fmtNumber(sys.machine_cpus)} cores`),
    chart("Memory", fmtBytes(memUsed) + " used", lineChart(series((x) => x.system.machine_memory_total_bytes - x.system.machine_memory_available_bytes), { max: sys.machine_memory_total_bytes, color: "#bf3989" }),
      `cortex resident: ${fmtBytes(sys.process_resident_memory_bytes)} · total ${fmtBytes(sys.machine_memory_total_bytes)}`),
  ];
  if (m.device && m.device.kind !== "cpu") {
    charts.push(chart(`${m.device.name} memory`, fmtBytes(m.device.memory_total_bytes - m.device.memory_free_bytes) + " used",
      lineChart(series((x) => x.device ? x.device.memory_total_bytes - x.device.memory_free_bytes : 0), { max: m.device.memory_total_bytes }),
      `${m.device.description} · cortex ${fmtBytes(m.device.memory_used_bytes)} of ${fmtBytes(m.device.memory_total_bytes)}`));
  }
  return [
    h("h2", {}, "Loaded models"),
    h("div", { className: "table-wrap" }, m.models.length === 0 ? h("p", { className: "muted" }, "None loaded.") : h("table", { id: "models" },
      h("thead", {}, h("tr", {}, h("th", {}, "Model"), h("th", { className: "num" }, "Size"), h("th", { className: "num" }, "On GPU"), h("th", {}, "Unloads"))),
      h("tbody", {}, m.models.map((model) => h("tr", {}, h("td", {}, model.name), h("td", { className: "num" }, fmtBytes(model.size)),
        h("td", { className: "num" }, fmtBytes(model.size_vram)), h("td", {}, model.expires_at ? new Date(model.expires_at).toLocaleTimeString() : "never")))))),
    h("h2", {}, "Engine and machine"),
    h("p", { className: "muted" }, m.device ? `Device: ${m.device.name} (${m.device.description})` : "No model loaded yet."),
    h("div", { className: "charts", id: "gauges" }, charts),
    h("div", { className: "stats" }, stat("Steps", fmtNumber(m.engine.steps)), stat("Prompt tokens", fmtNumber(m.engine.prompt_tokens)),
      stat("Prefill saved by sharing", fmtNumber(m.engine.prefill_tokens_saved)), stat("Generated tokens", fmtNumber(m.engine.generated_tokens)),
      stat("Online requests now", fmtNumber(m.online.in_flight)), stat("Preemptions", fmtNumber(m.engine.preemptions))),
    h("h2", {}, "Workers on the queue"),
    h("div", { className: "table-wrap" }, m.queue.workers.length === 0 ? h("p", { className: "muted" }, "No worker has registered.") : h("table", { id: "workers" },
      h("thead", {}, h("tr", {}, h("th", {}, "Host"), h("th", { className: "num" }, "PID"), h("th", { className: "num" }, "In flight"), h("th", {}, "Last heartbeat"), h("th", {}, "Registered"))),
      h("tbody", {}, m.queue.workers.map((w) => h("tr", {}, h("td", {}, w.host), h("td", { className: "num" }, w.pid), h("td", { className: "num" }, w.running),
        h("td", {}, w.heartbeat_at ? age(w.heartbeat_at) + " ago" : "–"), h("td", {}, age(w.registered_at) + " ago")))))),
  ];
}

window.addEventListener("hashchange", route);
route();
