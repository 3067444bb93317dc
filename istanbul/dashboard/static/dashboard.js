// istanbul dashboard: draws what /api/stream sends (server-sent events, see app.py).
//   snapshot  the overview: counts, jobs, daemons, datasets, dead letters, tokenizer metrics
//   job       the selected job's whole panel (location.hash = #job=ID)
//   update    new points and events of that job, and its summary
//   problem   Redis (or the job) cannot be read right now
// Everything from Redis is put in the page as text (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const STATUSES = ["queued", "leased", "running", "stalled", "done", "failed", "dead-lettered",
                  "cancelled"];
const TOKEN_KEY = "istanbul-dashboard-token";
const CHARTS = {
  lr: {title: "learning rate", color: "#7a56c9"},
  grad_norm: {title: "grad norm", color: "#2a9d5c"},
  tokens_per_s: {title: "tokens/s", color: "#c99a13"},
};

let config = null;
let source = null;
let selected = null;        // the job id of the panel
let panel = null;           // its series: Maps step -> value, and its uPlot charts

// ---- formatting ---------------------------------------------------------------------------

function num(x, digits = 4) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (Math.abs(x) >= 1000) return Math.round(x).toLocaleString("en-US");
  return Number(x).toPrecision(digits).replace(/\.?0+(e|$)/, "$1");
}
function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.max(0, Math.round(s));
  if (s >= 3600) return `${Math.floor(s / 3600)}h${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
  if (s >= 60) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${s}s`;
}
function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
function clock(ts) {
  return ts ? new Date(ts * 1000).toLocaleTimeString("en-GB") : "–";
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}
function fill(tbody, rows) { tbody.replaceChildren(...rows); }
function statusBadge(status) { return el("span", {class: `status ${status}`}, status); }
function progress(step, total) {
  const pct = total ? Math.min(100, 100 * step / total) : 0;
  const bar = el("span", {class: "bar"}, el("span"));
  bar.firstChild.style.width = `${pct}%`;
  return el("span", {}, bar, el("span", {class: "steps"}, `${step}/${total || "?"}`));
}
function summary(dl, items) {
  dl.replaceChildren(...items.map(([label, value, cls]) =>
    el("div", {}, el("dt", {}, label), el("dd", {class: cls || null}, value))));
}

// ---- the overview -------------------------------------------------------------------------

function renderSnapshot(snap) {
  $("redis").textContent = snap.redis;
  $("counts").replaceChildren(...STATUSES.map((s) =>
    el("div", {class: "tile", "data-status": s},
       el("div", {class: "n"}, snap.counts[s] || 0), el("div", {class: "label"}, s))));

  fill($("jobs").tBodies[0], snap.jobs.map((j) => {
    const row = el("tr", {class: "job-row" + (j.id === selected ? " selected" : ""),
                          "data-job": j.id, "data-status": j.status},
      el("td", {}, el("code", {}, j.id)), el("td", {class: "state"}, statusBadge(j.status)),
      el("td", {}, progress(j.step, j.total_steps)),
      el("td", {class: "num"}, num(j.loss)), el("td", {class: "num"}, num(j.eval_loss)),
      el("td", {class: "num"}, j.status === "running" ? num(j.tokens_per_s) : "–"),
      el("td", {class: "num"}, j.status === "running" ? duration(j.eta_s) : "–"),
      el("td", {}, j.owner || "–"),
      el("td", {class: "num"}, `${j.attempts}` + (j.failures ? ` (${j.failures} failed)` : "")),
      el("td", {class: "error", title: j.error || j.last_error || ""},
         j.error || j.last_error || ""));
    row.addEventListener("click", () => { location.hash = `job=${encodeURIComponent(j.id)}`; });
    return row;
  }));
  $("no-jobs").hidden = snap.jobs.length > 0;

  fill($("daemons").tBodies[0], snap.daemons.map((d) =>
    el("tr", {"data-daemon": d.name},
       el("td", {}, el("code", {}, d.name)),
       el("td", {}, statusBadge(d.alive ? (d.jobs.length ? "running" : "idle") : "gone")),
       el("td", {}, `${duration(d.idle_s)} ago`),
       el("td", {}, d.jobs.join(", ") || "–"),
       el("td", {}, d.adapter || (d.jobs.length ? "?" : "– (shown while it runs a job)")))));
  $("no-daemons").hidden = snap.daemons.length > 0;

  fill($("datasets").tBodies[0], snap.datasets.map((d) =>
    el("tr", {}, el("td", {}, el("code", {}, d.name)), el("td", {}, d.state),
       el("td", {class: "num"}, d.shards), el("td", {class: "num"}, num(d.tokens)),
       el("td", {class: "num"}, num(d.documents)),
       el("td", {}, `${d.vocab_name || "?"} (${num(d.n_vocab)} ids, ${d.vocab_hash})`))));
  $("no-datasets").hidden = snap.datasets.length > 0;

  fill($("dead").tBodies[0], snap.dead_letters.map((d) =>
    el("tr", {}, el("td", {}, el("code", {}, d.job || "?")), el("td", {}, d.reason || ""),
       el("td", {class: "num"}, d.failures || ""), el("td", {}, clock(Number(d.at))),
       el("td", {class: "error", title: d.error || ""}, d.error || ""))));
  $("no-dead").hidden = snap.dead_letters.length > 0;

  renderTokenizer(snap.tokenizer);
}

function renderTokenizer(t) {
  $("tokenizer").hidden = !t;
  if (!t) return;
  $("tokenizer-url").textContent = t.url;
  if (!t.ok) {
    summary($("tokenizer-summary"), [["metrics", t.error, "error"]]);
    return;
  }
  const ms = (x) => (x === null || x === undefined ? "–" : `${num(1000 * x, 3)} ms`);
  const lat = t.latency_s, docs = t.batch_documents;
  summary($("tokenizer-summary"), [
    ["requests/s", num(t.requests_per_s)], ["errors/s", num(t.errors_per_s)],
    ["tokens/s", num(t.tokens_per_s)], ["in flight", num(t.inflight)],
    ["latency p50", ms(lat.p50)], ["latency p95", ms(lat.p95)], ["latency p99", ms(lat.p99)],
    ["batch docs (mean)", num(docs.mean, 3)], ["batch docs p50 / p95",
      `${num(docs.p50, 3)} / ${num(docs.p95, 3)}`],
    ["requests per batch", num(t.batch_requests.mean, 3)],
    ["queue wait p95", ms(t.queue_wait_s.p95)],
    ["ready", t.ready === 1 ? "yes" : t.ready === 0 ? "no" : "–"],
    ["adapter", t.adapter || "–"],
    ["window", t.window_s ? `last ${Math.round(t.window_s)} s` : "since start"],
  ]);
}

// ---- one job ------------------------------------------------------------------------------

function tick(v) {
  if (v === null) return "";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-2 || a >= 1e5)) return v.toExponential(1);
  return a >= 1000 ? Math.round(v).toLocaleString("en-US") : String(Number(v.toPrecision(3)));
}

function chart(target, title, series) {
  const width = Math.max(240, target.clientWidth || target.parentNode.clientWidth || 300);
  return new uPlot({
    title, width, height: 220, legend: {live: false},
    scales: {x: {time: false}},
    axes: [{label: "step", size: 40}, {size: 60, values: (u, vals) => vals.map(tick)}],
    series: [{label: "step"}, ...series],
  }, [[], ...series.map(() => [])], target);
}

function newPanel(jobId) {
  const lossTarget = $("loss-chart"), panelData = {
    id: jobId, loss: new Map(), eval: new Map(), series: {}, charts: {}, events: [],
  };
  for (const target of document.querySelectorAll(".chart")) target.replaceChildren();
  panelData.charts.loss = chart(lossTarget, "loss (nats/token)", [
    {label: "training", stroke: "#2f6fde", width: 1.2, points: {show: false}},
    {label: "held-out", stroke: "#e0782d", width: 2, spanGaps: true,
     points: {show: true, size: 6, fill: "#e0782d"}},
  ]);
  for (const [name, spec] of Object.entries(CHARTS)) {
    panelData.series[name] = new Map();
    panelData.charts[name] = chart($(`${name}-chart`), spec.title, [
      {label: spec.title, stroke: spec.color, width: 1.2, points: {show: false}}]);
  }
  return panelData;
}

// Every step's progress event is in the charts; the list shows the others.
function notProgress(e) { return e.type !== "progress"; }

function addPoints(map, pairs) { for (const [step, value] of pairs) map.set(step, value); }

function redraw() {
  const steps = [...new Set([...panel.loss.keys(), ...panel.eval.keys()])].sort((a, b) => a - b);
  panel.charts.loss.setData([steps, steps.map((s) => panel.loss.has(s) ? panel.loss.get(s) : null),
                             steps.map((s) => panel.eval.has(s) ? panel.eval.get(s) : null)]);
  const target = $("loss-chart");
  target.dataset.points = panel.loss.size;
  target.dataset.evalPoints = panel.eval.size;
  target.dataset.lastStep = steps.length ? steps[steps.length - 1] : 0;
  for (const name of Object.keys(CHARTS)) {
    const map = panel.series[name];
    const xs = [...map.keys()].sort((a, b) => a - b);
    panel.charts[name].setData([xs, xs.map((s) => map.get(s))]);
  }
}

function renderJob(detail) {
  selected = detail.job.id;
  $("job-detail").hidden = false;
  $("job-id").textContent = selected;
  panel = newPanel(selected);
  addPoints(panel.loss, detail.loss);
  addPoints(panel.eval, detail.eval_loss);
  for (const name of Object.keys(CHARTS)) addPoints(panel.series[name], detail.series[name]);
  panel.backoffs = detail.loss_scale_backoffs.length;
  panel.skipped = detail.skipped_steps;
  panel.events = detail.events.filter(notProgress);
  $("spec").textContent = JSON.stringify(detail.spec, null, 2);
  redraw();
  renderJobSummary(detail.job);
  renderEvents();
  for (const row of document.querySelectorAll("tr.job-row")) {
    row.classList.toggle("selected", row.dataset.job === selected);
  }
}

function applyUpdate(update) {
  if (!panel || update.job.id !== panel.id) return;
  addPoints(panel.loss, update.loss);
  addPoints(panel.eval, update.eval_loss);
  for (const name of Object.keys(CHARTS)) addPoints(panel.series[name], update.series[name]);
  panel.backoffs += update.loss_scale_backoffs.length;
  panel.skipped += update.skipped_steps;
  panel.events = panel.events.concat(update.events.filter(notProgress)).slice(-25);
  if (update.loss.length || update.eval_loss.length || update.events.length) redraw();
  renderJobSummary(update.job);
  renderEvents();
}

function renderJobSummary(job) {
  const badge = $("job-status");
  badge.className = `status ${job.status}`;
  badge.textContent = job.status + (job.cancel_requested && job.state === "running"
                                    ? " (cancel requested)" : "");
  $("job-detail").dataset.status = job.status;
  const lease = job.lease ? `${job.lease.holder} (${job.lease.ttl_s.toFixed(0)} s left)` : "–";
  const items = [
    ["step", `${job.step} / ${job.total_steps}`], ["loss", num(job.loss)],
    ["held-out loss", num(job.eval_loss)], ["tokens/s", num(job.tokens_per_s)],
    ["learning rate", num(job.lr, 3)], ["grad norm", num(job.grad_norm, 3)],
    ["loss-scale back-offs", `${panel.backoffs}`],
    ["skipped steps", `${panel.skipped}`],
    ["ETA", job.state === "running" ? duration(job.eta_s) : "–"],
    ["tokens", num(job.tokens)], ["dataset / model", `${job.dataset} / ${job.model}`],
    ["daemon", job.owner || "–"], ["lease", lease], ["GPU", job.adapter || "–"],
    ["attempts", `${job.attempts} (failures in a row: ${job.failures})`],
    ["submitted", clock(job.created_at)], ["finished", clock(job.finished_at)],
  ];
  if (job.error) items.push(["error", job.error, "error"]);
  else if (job.last_error) items.push(["last error", job.last_error, "error"]);
  summary($("job-summary"), items);
  fill($("checkpoints").tBodies[0], job.checkpoints.slice().reverse().map((c) => {
    const verdict = c.verified === true ? "✓ verified"
      : c.verified === false ? `✗ ${c.problem}`
      : c.readable ? "… checking" : `– ${c.problem || ""}`;
    return el("tr", {"data-step": c.step},
              el("td", {class: "num"}, c.step ?? "?"), el("td", {class: "num"}, bytes(c.bytes)),
              el("td", {class: c.verified === false ? "error" : null}, verdict),
              el("td", {}, el("code", {}, c.path)));
  }));
}

function renderEvents() {
  $("events").replaceChildren(...panel.events.slice().reverse().map((e) => {
    const data = Object.assign({}, e.data);
    const ts = data.ts;
    delete data.ts;
    const text = Object.entries(data).filter(([k]) => k !== "spec")
      .map(([k, v]) => `${k}=${typeof v === "number" ? num(v) : JSON.stringify(v)}`).join(" ");
    return el("li", {}, `${clock(ts)} `, el("span", {class: "type"}, e.type), ` ${text}`);
  }));
}

// ---- actions ------------------------------------------------------------------------------

async function act(action) {
  const message = $("action-message");
  if (!selected) return;
  const token = $("token").value.trim();
  const headers = token ? {Authorization: `Bearer ${token}`} : {};
  message.className = "message";
  message.textContent = `${action}…`;
  let reply, body = {};
  try {
    reply = await fetch(`/api/jobs/${encodeURIComponent(selected)}/${action}`,
                        {method: "POST", headers});
    body = await reply.json();
  } catch (err) {
    message.className = "message refused";
    message.textContent = `${action} failed: ${err}`;
    return;
  }
  message.dataset.status = reply.status;
  if (reply.ok) {
    message.className = "message ok";
    message.textContent = body.message;
  } else {
    message.className = "message refused";
    message.textContent = `refused (${reply.status}): ${body.error || reply.statusText}`;
  }
}

// ---- wiring -------------------------------------------------------------------------------

function jobFromHash() {
  const match = /(?:^#|&)job=([^&]+)/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}

function setLive(on) {
  const badge = $("live");
  badge.classList.toggle("off", !on);
  badge.dataset.live = on ? "1" : "0";
  badge.textContent = on ? "live" : "reconnecting";
}

function connect() {
  if (source) source.close();
  const job = jobFromHash();
  if (!job) { selected = null; panel = null; $("job-detail").hidden = true; }
  source = new EventSource("/api/stream" + (job ? `?job=${encodeURIComponent(job)}` : ""));
  source.onopen = () => setLive(true);
  source.onerror = () => setLive(false);
  const handle = (name, fn) => source.addEventListener(name, (e) => {
    $("problem").hidden = true;
    fn(JSON.parse(e.data));
  });
  handle("snapshot", renderSnapshot);
  handle("job", renderJob);
  handle("update", applyUpdate);
  source.addEventListener("problem", (e) => {
    const problem = $("problem");
    problem.hidden = false;
    problem.textContent = JSON.parse(e.data).error;
  });
}

async function init() {
  config = await (await fetch("/api/config")).json();
  $("redis").textContent = config.redis;
  const banner = $("auth-banner");
  if (!config.actions) {
    banner.hidden = false;
    banner.textContent = config.read_only_reason;
  }
  $("token-form").addEventListener("submit", (e) => e.preventDefault());
  const token = $("token");
  token.value = sessionStorage.getItem(TOKEN_KEY) || "";
  token.addEventListener("input", () => sessionStorage.setItem(TOKEN_KEY, token.value.trim()));
  $("cancel").addEventListener("click", () => act("cancel"));
  $("requeue").addEventListener("click", () => act("requeue"));
  window.addEventListener("hashchange", connect);
  window.addEventListener("resize", () => {
    if (!panel) return;
    for (const [name, u] of Object.entries(panel.charts)) {
      u.setSize({width: $(`${name}-chart`).clientWidth, height: 220});
    }
  });
  connect();
}

init();
