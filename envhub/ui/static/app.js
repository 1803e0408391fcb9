// The trajectory viewer: runs, trajectories, turns with tokens, and playing an env by hand.
// Every piece of recorded or env text goes into the page through textContent (never innerHTML),
// so model outputs and observations cannot inject markup.
"use strict";

const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;
const VIEWS = ["runs-view", "run-view", "trajectory-view", "play-view"];
let lastRunHash = "#/runs";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key === "title") node.title = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

async function getJson(url, options = {}) {
  const response = await fetch(url, options);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const detail = body.detail === undefined ? response.statusText : body.detail;
    throw new Error(`${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
  return body;
}

function showMessage(text) {
  $("message").textContent = text;
  $("message").hidden = !text;
}

function showView(id) {
  for (const view of VIEWS) $(view).hidden = view !== id;
}

const fmt = (x, digits = 3) => (x === null || x === undefined ? "—" : Number(x).toFixed(digits));
const versions = (lo, hi) => (lo < 0 ? "—" : lo === hi ? `${lo}` : `${lo}–${hi}`);

// ------------------------------------------------------------------ routing (location.hash)

async function route() {
  showMessage("");
  const hash = location.hash || "#/runs";
  const [path, query = ""] = hash.slice(1).split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  try {
    if (parts[0] === "run" && parts.length === 2) await showRun(parts[1], new URLSearchParams(query));
    else if (parts[0] === "run" && parts[2] === "t") await showTrajectory(parts[1], Number(parts[3]));
    else if (parts[0] === "play") await showPlay();
    else await showRuns();
  } catch (error) {
    showMessage(String(error.message || error));
  }
}

// ------------------------------------------------------------------ runs

async function showRuns() {
  showView("runs-view");
  const data = await getJson("/ui/api/runs");
  $("runs-dir").textContent = `in ${data.runs_dir}`;
  const body = $("runs-table").tBodies[0];
  body.replaceChildren(...data.runs.map((run) => {
    const row = el("tr", { class: "clickable", "data-run": run.name },
      el("td", {}, el("a", { href: `#/run/${enc(run.name)}` }, run.name)), el("td", {}, run.model),
      el("td", {}, (run.envs || []).join(", ")), el("td", {}, run.max_steps ?? "—"),
      el("td", {}, `${(run.trajectory_bytes / 1e6).toFixed(2)} MB${run.has_trained_record ? "" : " (no trained record)"}`),
      el("td", {}, run.checkpoints.join(", ") || "—"),
      el("td", {}, new Date(run.modified_unix_s * 1000).toLocaleString()));
    row.addEventListener("click", () => { location.hash = `#/run/${enc(run.name)}`; });
    return row;
  }));
  if (!data.runs.length) body.append(el("tr", {}, el("td", { colspan: 7 }, "no runs in this folder yet")));
}

// ------------------------------------------------------------------ one run's trajectories

const FILTERS = ["env", "step", "success", "purpose"];

function setOptions(select, values, label) {
  const chosen = select.value;
  for (const option of [...select.options]) if (option.dataset.facet) option.remove();
  for (const value of values) select.append(el("option", { value, "data-facet": "1" }, label(value)));
  select.value = chosen;
}

async function showRun(run, params) {
  showView("run-view");
  $("run-name").textContent = run;
  const offset = Number(params.get("offset") || 0);
  const query = new URLSearchParams({ offset, limit: Number(params.get("limit") || 50) });
  for (const name of FILTERS) if (params.get(name)) query.set(name, params.get(name));
  const data = await getJson(`/ui/api/runs/${enc(run)}/trajectories?${query}`);
  lastRunHash = location.hash;
  setOptions($("filter-env"), data.envs, (v) => v);
  setOptions($("filter-step"), data.steps.map(String), (v) => `step ${v}`);
  for (const name of FILTERS) $(`filter-${name}`).value = params.get(name) || "";
  $("match-count").textContent = `${data.total} of ${data.count} trajectories` +
    (data.bad_records ? ` (${data.bad_records} unreadable records skipped)` : "");
  $("trajectories-table").tBodies[0].replaceChildren(...data.items.map((t) => trajectoryRow(run, t)));
  const last = Math.min(data.offset + data.limit, data.total);
  $("page-info").textContent = data.total ? `${data.offset + 1}–${last} of ${data.total}` : "none";
  $("page-prev").disabled = data.offset === 0;
  $("page-next").disabled = last >= data.total;
  $("page-prev").onclick = () => goRun(run, { offset: Math.max(0, data.offset - data.limit) });
  $("page-next").onclick = () => goRun(run, { offset: data.offset + data.limit });
}

function trajectoryRow(run, t) {
  const row = el("tr", { class: "clickable", "data-number": t.number },
    el("td", {}, t.number), el("td", {}, t.env_id), el("td", {}, t.task_id), el("td", {}, t.purpose),
    el("td", {}, fmt(t.reward, 2)), el("td", {}, t.success ? "yes" : "no"),
    el("td", {}, `${t.status} / ${t.finish_reason}`), el("td", {}, `${t.num_turns} / ${t.turn_cap}`),
    el("td", {}, `${t.num_tokens} (${t.num_action_tokens})`), el("td", {}, versions(t.version_min, t.version_max)),
    el("td", { class: "learner-step" }, t.learner_step ?? "not trained"), el("td", {}, fmt(t.advantage)));
  row.addEventListener("click", () => { location.hash = `#/run/${enc(run)}/t/${t.number}`; });
  return row;
}

function goRun(run, changes) {
  const params = new URLSearchParams();
  for (const name of FILTERS) if ($(`filter-${name}`).value) params.set(name, $(`filter-${name}`).value);
  for (const [key, value] of Object.entries(changes)) params.set(key, value);
  location.hash = `#/run/${enc(run)}?${params}`;
}

// ------------------------------------------------------------------ one trajectory

async function showTrajectory(run, number) {
  showView("trajectory-view");
  const data = await getJson(`/ui/api/runs/${enc(run)}/trajectories/${number}`);
  const t = data.row;
  $("back-to-run").textContent = run;
  $("back-to-run").href = lastRunHash.startsWith(`#/run/${enc(run)}`) ? lastRunHash : `#/run/${enc(run)}`;
  $("trajectory-number").textContent = `#${t.number}`;
  const trained = data.trained ? `step ${data.trained.learner_step}, advantage ${fmt(data.trained.advantage)}`
    : "not trained";
  const facts = [["env", t.env_id], ["task", t.task_id], ["purpose", t.purpose], ["reward", fmt(t.reward, 3)],
    ["success", t.success ? "yes" : "no"], ["status", t.status], ["finish reason", t.finish_reason],
    ["turns", `${t.num_turns} (cap ${t.turn_cap})`], ["tokens", `${t.num_tokens}, ${t.num_action_tokens} action`],
    ["policy versions", versions(t.version_min, t.version_max)], ["learner", trained],
    ["lease / group", `${t.lease_id} / ${t.group_id} #${t.episode_index}`], ["actor", t.actor_id]];
  if (data.error) facts.push(["error", data.error]);
  if (Object.keys(data.env_info || {}).length) facts.push(["env info", JSON.stringify(data.env_info)]);
  $("trajectory-summary").replaceChildren(...facts.flatMap(([key, value]) => [el("dt", {}, key), el("dd", {}, value)]));
  $("trajectory-summary").dataset.trained = data.trained ? "yes" : "no";
  $("tokenizer-note").textContent = data.tokenizer.error || `decoded with ${data.tokenizer.source}`;
  const cards = data.turns.map(turnCard);
  if (data.tail) cards.push(tailCard(data.tail));
  $("turns").replaceChildren(...cards);
}

function turnCard(turn) {
  const meta = [`policy version ${turn.policy_versions ? versions(...turn.policy_versions) : "—"}`,
    `advantage ${turn.advantage === null ? "not trained" : fmt(turn.advantage)}`,
    turn.reward === null ? "reward — (only the episode's final reward is recorded)" : `episode reward ${fmt(turn.reward)}`];
  return el("div", { class: "turn", "data-turn": turn.turn },
    el("h2", {}, `Turn ${turn.turn}`), el("p", { class: "meta" }, meta.join(" · ")),
    el("div", { class: "text observation" }, turn.observation.text),
    el("div", { class: "text action" }, turn.action.text),
    el("details", { class: "token-details", open: "" }, el("summary", {}, "tokens"),
      tokenSpans(turn.observation, el("div", { class: "tokens" })), tokenSpans(turn.action, el("div", { class: "tokens" }))));
}

function tailCard(tail) {
  return el("div", { class: "turn tail" }, el("h2", {}, "After the last turn"),
    el("div", { class: "text observation" }, tail.text), tokenSpans(tail, el("div", { class: "tokens" })));
}

function tokenSpans(block, container) {
  block.ids.forEach((id, i) => {
    const action = block.loss_mask[i] === 1;
    const advantage = block.advantages ? block.advantages[i] : null;
    const title = `#${block.start + i} id ${id} · loss mask ${block.loss_mask[i]}` +
      (action ? ` · version ${block.versions[i]} · logprob ${fmt(block.logprobs[i])}` : "") +
      (advantage !== null ? ` · advantage ${fmt(advantage)}` : "");
    container.append(el("span", { class: action ? "tok act" : "tok env", "data-id": id, "data-position": block.start + i,
      title }, block.pieces[i].replace(/\n/g, "\u21b5\n")));  // a visible mark where the token is a newline
  });
  return container;
}

// ------------------------------------------------------------------ playing an env by hand

let envs = null;
let session = null;
let turnsPlayed = 0;

async function showPlay() {
  showView("play-view");
  if (envs) return;
  envs = await getJson("/envs");
  $("play-env").replaceChildren(...envs.map((env) => el("option", { value: env.id }, env.id)));
  $("play-env").onchange = describeTasks;
  describeTasks();
}

function describeTasks() {
  const env = envs.find((e) => e.id === $("play-env").value);
  if (!env) return;
  $("play-tasks").textContent = env.splits
    ? `turn cap ${env.max_turns}; tasks: ` + Object.entries(env.splits).map(([name, n]) => `${name} ${n}`).join(", ")
    : `tasks unavailable: ${env.error}`;
}

function logEntry(kind, text) {
  const entry = el("div", { class: `entry ${kind}` }, text);
  $("play-log").append(entry);
  entry.scrollIntoView({ block: "nearest" });
}

function setSessionOpen(open) {
  for (const id of ["play-action", "play-step-button", "play-close"]) $(id).disabled = !open;
  if (open) $("play-action").focus();
}

async function closeSession() {
  if (!session) return;
  const id = session;
  session = null;
  setSessionOpen(false);
  await fetch(`/sessions/${enc(id)}`, { method: "DELETE", keepalive: true }).catch(() => {});
}

$("play-reset").addEventListener("submit", async (event) => {
  event.preventDefault();
  await closeSession();
  $("play-log").replaceChildren();
  const body = { env_id: $("play-env").value, task_id: $("play-task").value.trim(), seed: Number($("play-seed").value || 0) };
  try {
    const created = await getJson("/sessions", { method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify(body) });
    session = created.session_id;
    turnsPlayed = 0;
    // What an agent reads first: the env's instruction (its conversation start), then the observation.
    const start = await getJson(`/envs/${enc(body.env_id)}/conversation`).catch(() => null);
    if (start && start.instruction) logEntry("observation", start.instruction);
    logEntry("observation", created.observation);
    $("play-status").textContent = `session ${session}: ${body.env_id} task ${body.task_id} seed ${body.seed}`;
    setSessionOpen(true);
  } catch (error) {
    logEntry("error", String(error.message));
  }
});

$("play-step").addEventListener("submit", async (event) => {
  event.preventDefault();
  const action = $("play-action").value;
  if (!session || !action.trim()) return;
  $("play-action").value = "";
  logEntry("action", action);
  try {
    const result = await getJson(`/sessions/${enc(session)}/step`, { method: "POST",
      headers: { "content-type": "application/json" }, body: JSON.stringify({ action }) });
    logEntry("observation", result.observation);
    turnsPlayed += 1;
    const ended = result.terminated || result.truncated;
    const success = result.info && "success" in result.info ? ` · success ${result.info.success}` : "";
    $("play-status").textContent = `reward ${result.reward}${success}` +
      (result.terminated ? " · terminated" : "") + (result.truncated ? " · truncated" : "") + ` · turn ${turnsPlayed}`;
    if (ended) await closeSession();
    else $("play-action").focus();
  } catch (error) {
    logEntry("error", String(error.message));
    if (/^(404|410|500|504)/.test(error.message)) await closeSession();
  }
});

$("play-close").addEventListener("click", closeSession);
for (const name of FILTERS) {
  $(`filter-${name}`).addEventListener("change", () => goRun($("run-name").textContent, { offset: 0 }));
}
window.addEventListener("pagehide", () => { closeSession(); });
window.addEventListener("hashchange", route);
route();
