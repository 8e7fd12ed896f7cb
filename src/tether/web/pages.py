"""The runs' pages of `tether serve` (the list and one run; the inbox is `inbox_page`): server-rendered HTML and a little JavaScript over SSE.

No build step. Everything a model or a tool produced reaches the page through `textContent`,
never `innerHTML`, so it is shown as text, whatever it holds.
"""

from __future__ import annotations

from typing import Any

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 980px; padding: 1rem;
       color: #1d2430; background: #fafbfc; }
h1 { font-size: 1.3rem; } h1 a { color: inherit; text-decoration: none; }
table { border-collapse: collapse; width: 100%; background: white; }
td, th { border-bottom: 1px solid #e3e6ea; padding: .35rem .5rem; text-align: left; }
form.start { background: white; border: 1px solid #e3e6ea; padding: .8rem; margin: 1rem 0; }
form.start textarea { width: 100%; min-height: 4rem; }
.status-done { color: #176f2c; } .status-failed, .status-cancelled { color: #a4161a; }
.status-halted { color: #9a6700; }
.item { background: white; border: 1px solid #e3e6ea; border-radius: 6px; margin: .5rem 0;
        padding: .5rem .7rem; white-space: pre-wrap; overflow-wrap: anywhere; }
.user { border-left: 4px solid #4a6ee0; } .assistant { border-left: 4px solid #6f42c1; }
.tool { border-left: 4px solid #8a96a3; font-family: ui-monospace, monospace; font-size: 13px; }
.tool .name { font-weight: bold; } .error { border-left-color: #a4161a; color: #a4161a; }
.approval, .question { background: #fff8e1; border: 1px solid #f0c36d; padding: .4rem; margin-top: .4rem; }
.question label { display: block; margin: .2rem 0; }
.note { color: #68727d; font-size: 13px; } .answer { border: 2px solid #176f2c; }
.fork { margin: .2rem 0; } .fork button { font-size: 12px; }
#bar { position: sticky; top: 0; background: #fafbfc; padding: .4rem 0; display: flex;
       gap: 1rem; align-items: center; border-bottom: 1px solid #e3e6ea; }
button { cursor: pointer; }
#timeline { position: relative; background: white; border: 1px solid #e3e6ea; margin: .5rem 0;
            border-radius: 6px; overflow: hidden; }
#timeline .bar { position: absolute; height: 14px; border-radius: 3px; min-width: 3px; border: 0;
                 padding: 0 3px; color: white; font: 10px/14px ui-monospace, monospace;
                 overflow: hidden; white-space: nowrap; text-align: left; }
#timeline .model, #legend .model { background: #6f42c1; }
#timeline .tool, #legend .tool { background: #8a96a3; }
#timeline .tool.error, #legend .tool.error { background: #a4161a; } #timeline .open { opacity: .5; }
#timeline .scale { position: absolute; right: .4rem; bottom: 0; }
#legend .key { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
               margin: 0 .3rem 0 .8rem; vertical-align: middle; }
.flash { outline: 2px solid #f0c36d; }
.panel { background: white; border: 1px solid #e3e6ea; border-radius: 6px; margin: .8rem 0;
         padding: .5rem .8rem; } .panel h2 { font-size: 1rem; margin: .2rem 0 .4rem; }
.chart { width: 100%; height: auto; display: block; } .chart .axis { font-family: system-ui, sans-serif; fill: #68727d; }
.chart .base { stroke: #c9ced4; } .current { font-weight: bold; text-decoration: none; }
.c-started { fill: #4a6ee0; background: #4a6ee0; } .c-done { fill: #2e9e4f; background: #2e9e4f; }
.c-halted { fill: #d29922; background: #d29922; } .c-failed { fill: #cf222e; background: #cf222e; }
.c-cancelled { fill: #8a96a3; background: #8a96a3; } .c-tokens { fill: #6f42c1; }
.c-cost { fill: #1f883d; } .c-latency { fill: #4a6ee0; }
.legend .key { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
               margin: 0 .3rem 0 .6rem; vertical-align: middle; }
@media (max-width: 600px) {  /* a phone: the list keeps its first columns, forms wrap */
  body { padding: .5rem; } th:nth-child(n+5), td:nth-child(n+5) { display: none; }
  td, th { padding: .3rem; } td { overflow-wrap: anywhere; } #bar { flex-wrap: wrap; gap: .5rem; }
  input, textarea, select { max-width: 100%; box-sizing: border-box; } pre { white-space: pre-wrap; }
}
@media (prefers-color-scheme: dark) {  /* the same page, light text on dark surfaces */
  body { color: #d9dee5; background: #14171c; }
  table, form.start, .item, #timeline, .panel { background: #1d2128; border-color: #353b45; }
  .chart .axis { fill: #9aa4af; } .chart .base { stroke: #4a515c; }
  td, th, #bar { border-color: #353b45; } #bar { background: #14171c; }
  a { color: #8ab4f8; } .note { color: #9aa4af; }
  .approval, .question { background: #3a3020; border-color: #7a6430; }
  .status-done { color: #5fd07a; } .status-failed, .status-cancelled, .error { color: #ff8a8a; }
  .status-halted { color: #e0b34a; } .answer { border-color: #5fd07a; }
  input, textarea, select, button { background: #262b33; color: #d9dee5; border: 1px solid #4a515c; }
}
"""

INDEX_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Tether runs</title>
<style nonce="__NONCE__">__STYLE__</style></head>
<body>
<h1><a href="/">Tether</a> · runs <a class="note" href="/inbox">approvals inbox</a>
<a class="note" href="/dashboard">dashboard</a></h1>
<form class="start" id="start">
  <label>Task<br><textarea name="task" required placeholder="What should the agent do?"></textarea></label>
  <p><label>Model <input name="model" value="__MODEL__"></label>
     <label>Max steps <input name="max_steps" type="number" min="1" value="__MAX_STEPS__" size="5"></label>
     <label>Max cost (USD) <input name="max_cost" type="number" min="0" step="0.01" size="6"></label>
     <label>Account <input name="account" size="10" placeholder="none"></label>
     <label>Tool choice <select name="tool_choice"><option value="">auto</option>
       <option>required</option><option>none</option></select></label></p>
  <p>Tools: __TOOLS__</p>
  <button type="submit">Start run</button> __QUEUE__<span id="start-error" class="note"></span>
</form>
<form id="filter" class="note">Show <select name="state" aria-label="state">
  <option value="">every state</option><option>queued</option><option>running</option>
  <option>waiting</option><option>idle</option><option>done</option><option>halted</option>
  <option>failed</option><option>cancelled</option><option>interrupted</option></select>
  <input name="agent" size="12" placeholder="agent" aria-label="agent">
  <input name="account" size="12" placeholder="account" aria-label="account">
  <input name="q" type="search" size="32" placeholder="whose task, id or agent holds..."
  aria-label="text"> <span id="counts"></span></form>
<table><thead><tr><th>Run</th><th>Task</th><th>Status</th><th>Steps</th><th>Tokens</th>
<th>Cost</th></tr></thead><tbody id="runs"></tbody></table>
<p id="none" class="note" hidden>No run matches this filter.</p>
<p><button id="more" type="button" hidden>Older runs</button> <span id="scanned" class="note"></span></p>
<script nonce="__NONCE__">
__AUTH__
document.getElementById('start').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const body = {task: f.get('task'), model: f.get('model') || null,
                tools: f.getAll('tools'), max_steps: Number(f.get('max_steps')) || null,
                max_cost: f.get('max_cost') ? Number(f.get('max_cost')) : null,
                tool_choice: f.get('tool_choice') || null, queue: f.get('queue') === 'on',
                account: f.get('account') || null};
  const r = await api('/api/runs', {method: 'POST', body: JSON.stringify(body),
    headers: {'Content-Type': 'application/json'}});
  const out = await r.json();
  if (r.ok) { location.href = '/runs/' + encodeURIComponent(out.id || out.ids[0]); }
  else { document.getElementById('start-error').textContent = out.error; }
});
function cell(tr, text, cls) {
  const td = document.createElement('td'); td.textContent = text;
  if (cls) td.className = cls; tr.appendChild(td); return td;
}
function row(body, s, depth) {
  const tr = document.createElement('tr'); const td = cell(tr, '');
  if (depth) { tr.className = 'child'; td.appendChild(document.createTextNode('\u00a0\u00a0'.repeat(depth) + '\u21b3 ')); }
  const a = document.createElement('a'); a.href = '/runs/' + encodeURIComponent(s.id);
  a.textContent = s.id; td.appendChild(a);
  cell(tr, s.task.slice(0, 120));
  if (s.waiting_for_version) waitingCell(tr, s); else cell(tr, s.status, 'status-' + s.status);
  cell(tr, s.steps); cell(tr, s.tokens); cell(tr, '$' + s.cost_usd.toFixed(4));
  body.appendChild(tr);
}
// A run that waits for a worker of its agent's version, and the button that moves it to the
// version live workers have (POST .../upgrade); what refuses it is said beside the button.
function waitingCell(tr, s) {
  const td = cell(tr, 'waiting for version ' + s.waiting_for_version + ' ', 'status-queued');
  const b = td.appendChild(document.createElement('button'));
  b.type = 'button'; b.className = 'upgrade'; b.textContent = 'Upgrade';
  b.addEventListener('click', async () => {
    const r = await api('/api/runs/' + encodeURIComponent(s.id) + '/upgrade',
      {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'});
    const said = await r.json();
    td.replaceChildren(r.ok ? `upgraded to version ${said.to}` : said.error);
  });
}
// The filter lives in the URL (?state=done&q=invoice), so a filtered list can be shared; the
// server filters and pages (newest first, `next` is the cursor of the page after).
const filter = document.getElementById('filter');
for (const [k, v] of new URLSearchParams(location.search)) if (filter.elements[k]) filter.elements[k].value = v;
let shown = [], next = null, wanted = 50;
function query(limit, cursor) {
  const p = new URLSearchParams(), url = new URL(location.href);
  for (const k of ['state', 'agent', 'account', 'q']) {
    const v = k === 'q' ? filter.elements[k].value.trim().toLowerCase() : filter.elements[k].value.trim();
    if (v) { p.set(k, v); url.searchParams.set(k, v); } else url.searchParams.delete(k);
  }
  if (url.href !== location.href) history.replaceState(null, '', url);
  p.set('limit', limit); if (cursor) p.set('cursor', cursor);
  return '/api/list?' + p;
}
function counts(n) {
  const total = Object.values(n).reduce((a, b) => a + b, 0);
  document.getElementById('counts').textContent =
    `${total} runs: ` + Object.entries(n).map(([k, v]) => `${k} ${v}`).join(' · ');
}
function draw() {
  const body = document.getElementById('runs');
  document.getElementById('none').hidden = shown.length > 0;
  document.getElementById('more').hidden = !next;
  const ids = new Set(shown.map(s => s.id)); const children = {};
  for (const s of shown) if (s.parent_run_id && ids.has(s.parent_run_id)) {
    (children[s.parent_run_id] = children[s.parent_run_id] || []).push(s);
  }
  body.replaceChildren();
  const tree = (s, depth) => { row(body, s, depth); for (const c of (children[s.id] || []).reverse()) tree(c, depth + 1); };
  for (const s of shown) if (!(s.parent_run_id && ids.has(s.parent_run_id))) tree(s, 0);
}
async function load(cursor) {
  const r = await api(query(cursor ? 50 : Math.min(wanted, 500), cursor)); if (!r.ok) return;
  const page = await r.json();
  shown = cursor ? shown.concat(page.runs) : page.runs; next = page.next;
  wanted = Math.max(50, shown.length); counts(page.counts);
  document.getElementById('scanned').textContent = next && page.runs.length === 0
    ? `none among the ${page.scanned} runs read so far` : '';
  draw();
}
function refresh() { return load(null); }
filter.addEventListener('input', () => { wanted = 50; refresh(); });
filter.addEventListener('submit', (ev) => { ev.preventDefault(); refresh(); });
document.getElementById('more').addEventListener('click', () => load(next));
if (token) { refresh(); setInterval(refresh, 2000); }
</script>
</body></html>
"""

RUN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Tether run __RUN_ID__</title>
<style nonce="__NONCE__">__STYLE__</style></head>
<body>
<h1><a href="/">Tether</a> · run <span id="run-id">__RUN_ID__</span></h1>
<div id="bar">
  <span>Status: <b id="status">connecting</b></span>
  <span id="budget" class="note"></span>
  <button id="cancel">Cancel</button>
</div>
<div id="timeline" title="model calls (top row) and tool calls over time"></div>
<div id="legend" class="note">Timeline:<span class="key model"></span>model call<span
class="key tool"></span>tool call<span class="key tool error"></span>failed tool call
· a bar's tooltip has its time, tokens and outcome; click it to go to its step</div>
<div id="log"></div>
<form id="send"><input name="text" size="60" placeholder="Send a message to the run">
<button type="submit">Send</button> <span id="send-error" class="note"></span></form>
<script nonce="__NONCE__">
const runId = __RUN_ID_JSON__;
__AUTH__
const log = document.getElementById('log');
const state = {streaming: null, calls: {}, steps: 0, tokens: 0, budget: {}, base: 0};
function el(tag, cls, text) {
  const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e;
}
function add(node) { log.appendChild(node); return node; }
function post(path, body) {
  return api('/api/runs/' + encodeURIComponent(runId) + path, {method: 'POST',
    body: JSON.stringify(body || {}), headers: {'Content-Type': 'application/json'}});
}
function budget() {
  const b = state.budget; let text = `steps ${state.steps}` + (b.max_steps ? `/${b.max_steps}` : '');
  text += ` · tokens ${state.tokens}` + (b.max_tokens ? `/${b.max_tokens}` : '');
  if (state.cost !== undefined) text += ` · $${state.cost.toFixed(4)}`;
  if (b.max_cost_usd) text += ` (limit $${b.max_cost_usd})`;
  document.getElementById('budget').textContent = text;
}
// "Fork after step N": a new run from the conversation as it stood then (nothing of it runs
// again); a message is asked for (none: it goes on from the tools' results). On success the
// fork's page opens; a fork that cannot be made says why beside the button.
function forkButton(step) {
  const box = add(el('div', 'fork'));
  const button = box.appendChild(el('button', '', `Fork after step ${step}`));
  const said = box.appendChild(el('span', 'note error'));
  button.addEventListener('click', async () => {
    const message = prompt(`A message for the fork after step ${step} (empty: none)`);
    if (message === null) return;
    const r = await post('/fork', {at: step, message: message});
    const body = await r.json();
    if (r.ok) location.href = '/runs/' + encodeURIComponent(body.id);
    else said.textContent = ' ' + body.error;
  });
}
function decide(box, approvalId, argsHash, approved) {
  box.querySelectorAll('button').forEach(b => b.disabled = true);
  post(approved ? '/approve' : '/deny', approved
       ? {approval_id: approvalId, args_hash: argsHash}
       : {approval_id: approvalId, reason: 'denied in the web page'});
}
function answer(form, questionId, body) {
  const buttons = form.querySelectorAll('button'); buttons.forEach(b => b.disabled = true);
  post('/answer', Object.assign({question_id: questionId}, body)).then(async (r) => {
    if (r.ok) return;
    form.querySelector('.error').textContent = (await r.json()).error;
    buttons.forEach(b => b.disabled = false);
  });
}
__QUESTION_FORM__
// The timeline: each model call and tool call a bar from its start to its end (event times),
// model calls on the top row, tool calls on the first row free at their start.
const timeline = {t0: null, bars: [], open: {}};
// A bar is labelled with what it was (the model, a tool's name); its tooltip says how long it
// took, its tokens or outcome; a click scrolls to its step in the log (`target`).
function bar(kind, key, label, ts, target) {
  if (timeline.t0 === null) timeline.t0 = ts;
  const b = {kind, label, start: ts, end: null, error: false, detail: '', target: target || null};
  timeline.bars.push(b); timeline.open[key] = b; drawTimeline();
  return b;
}
function barEnd(key, ts, error, detail) {
  const b = timeline.open[key]; if (!b) return null;
  b.end = ts; b.error = !!error; b.detail = detail || ''; delete timeline.open[key]; drawTimeline();
  return b;
}
function tooltip(b) {
  const took = b.end === null ? 'running' : `${Math.round((b.end - b.start) * 1000)} ms`;
  return [b.label, took, b.detail].filter(Boolean).join(' · ');
}
function goTo(b) {
  if (!b.target) return;
  b.target.scrollIntoView({block: 'center'}); b.target.classList.add('flash');
  setTimeout(() => b.target.classList.remove('flash'), 1500);
}
function drawTimeline() {
  const box = document.getElementById('timeline'); box.replaceChildren();
  const bars = timeline.bars.slice(-500); if (!bars.length) return;
  const last = Math.max(...bars.map(b => b.end || b.start));
  const span = Math.max(last - timeline.t0, 0.001); const rows = [];  // rows[i]: when it is free
  for (const b of bars) {
    let row = 0;
    if (b.kind === 'tool') {
      row = 1; while (rows[row] !== undefined && rows[row] > b.start) row += 1;
      rows[row] = b.end === null ? Infinity : b.end;
    }
    const e = el('button', `bar ${b.kind}` + (b.error ? ' error' : '') + (b.end === null ? ' open' : ''), b.label);
    e.type = 'button'; e.onclick = () => goTo(b);
    const end = b.end === null ? last : b.end;
    e.style.left = `${(b.start - timeline.t0) / span * 100}%`;
    e.style.width = `${Math.max((end - b.start) / span * 100, 0.3)}%`;
    e.style.top = `${4 + row * 18}px`;
    e.title = tooltip(b); e.setAttribute('aria-label', e.title);
    box.appendChild(e);
  }
  const scale = el('div', 'note scale', `${span < 10 ? span.toFixed(2) : Math.round(span)} s`);
  box.appendChild(scale);
  box.style.height = `${26 + Math.max(rows.length, 1) * 18}px`;
}
const render = {
  run_started(d) {
    state.budget = d.budget || {};
    if (d.parent_run_id) {
      const up = add(el('div', 'note parent', 'started by the run '));
      const a = el('a', '', d.parent_run_id); a.href = '/runs/' + encodeURIComponent(d.parent_run_id);
      up.appendChild(a);
    }
    if (d.forked_from) {  // its conversation holds its origin's first steps: it counts on
      state.base = d.at;
      const up = add(el('div', 'note origin', 'a fork of the run '));
      const a = el('a', '', d.forked_from); a.href = '/runs/' + encodeURIComponent(d.forked_from);
      up.appendChild(a); up.appendChild(document.createTextNode(` after its step ${d.at}`));
    }
    if (d.version) add(el('div', 'note version', `${d.agent || 'agent'} version ${d.version}`));
    if (d.task) add(el('div', 'item user', d.task));
    document.getElementById('status').textContent = 'running'; budget();
  },
  upgraded(d) { add(el('div', 'note version', `upgraded from version ${d.from} to ${d.to}`)); },
  user_message(d) { add(el('div', 'item user', d.text)); },
  model_request(d) {
    if (state.modelCalls) forkButton(state.base + state.modelCalls);  // that step is whole
    state.modelCalls = (state.modelCalls || 0) + 1;
    state.modelBar = bar('model', 'model', `model call ${state.modelCalls}`, d.ts);
  },
  text_delta(d) {
    if (!state.streaming) state.streaming = add(el('div', 'item assistant streaming', ''));
    state.streaming.textContent += d.text;
  },
  model_response(d) {
    const u = d.usage || {};
    const b = barEnd('model', d.ts, false, `${u.input_tokens || 0} in, ${u.output_tokens || 0} out tokens`);
    let said = null;
    if (state.streaming) { said = state.streaming; said.textContent = d.text; said.classList.remove('streaming'); }
    else if (d.text) said = add(el('div', 'item assistant', d.text));
    if (b) { b.label = d.model || b.label; b.target = said; drawTimeline(); }  // calls only: the first
    state.replyBar = said ? null : b;
    state.streaming = null; state.steps += 1;
    state.tokens += (d.usage.input_tokens || 0) + (d.usage.output_tokens || 0); budget();
  },
  tool_call(d) {
    const box = add(el('div', 'item tool'));
    bar('tool', 'call:' + d.id, d.name, d.ts, box);
    if (state.replyBar) { state.replyBar.target = box; state.replyBar = null; }
    box.dataset.callId = d.id;
    box.appendChild(el('span', 'name', d.name));
    box.appendChild(el('span', 'args', ' ' + JSON.stringify(d.arguments, null, 1)));
    if (d.child_run_id) {  // an agent used as a tool: its run has a page of its own
      const a = el('a', 'child-run', 'child run ' + d.child_run_id);
      a.href = '/runs/' + encodeURIComponent(d.child_run_id); box.appendChild(el('div', '')).appendChild(a);
    }
    state.calls[d.id] = box;
  },
  approval_requested(d) {
    const box = state.calls[d.id] || add(el('div', 'item tool'));
    const ask = el('div', 'approval');
    ask.dataset.approvalId = d.approval_id;
    ask.appendChild(el('span', '', `Approve ${d.name} with exactly these arguments? `));
    const yes = el('button', 'approve', 'Approve'); const no = el('button', 'deny', 'Deny');
    yes.onclick = () => decide(ask, d.approval_id, d.args_hash, true);
    no.onclick = () => decide(ask, d.approval_id, d.args_hash, false);
    ask.append(yes, ' ', no); box.appendChild(ask);
  },
  question_asked(d) { (state.calls[d.id] || add(el('div', 'item tool'))).appendChild(questionForm(d, answer)); },
  question_answered(d) {
    const form = document.querySelector(`[data-question-id="${CSS.escape(d.question_id)}"]`);
    if (form) form.replaceChildren(el('span', 'decision', `Answered: ${d.action}` + (d.reason ? ` (${d.reason})` : '')));
  },
  approval_decided(d) {
    const ask = document.querySelector(`[data-approval-id="${CSS.escape(d.approval_id)}"]`);
    if (ask) ask.replaceChildren(el('span', 'decision', (d.approved ? 'Approved' : 'Denied') + ': ' + d.reason));
  },
  tool_result(d) {
    barEnd('call:' + d.id, d.ts, d.is_error, d.is_error ? 'failed' : 'ok');
    const box = state.calls[d.id] || add(el('div', 'item tool'));
    const out = el('div', 'result' + (d.is_error ? ' error' : ''), d.output);
    box.appendChild(out); if (d.is_error) box.classList.add('error');
  },
  retry(d) { add(el('div', 'note', `retry ${d.attempt} in ${d.delay}s: ${d.error.message}`)); },
  queued(d) { add(el('div', 'note', `queued (${d.what}, position ${d.position})`)); },
  restarting(d) { add(el('div', 'note', `restarting: ${d.reason}`)); },
  gave_up(d) { add(el('div', 'note', `gave up after ${d.restarts} restarts: ${d.reason}`)); },
  idle() { document.getElementById('status').textContent = 'idle'; },
  run_finished(d) {
    state.streaming = null; state.cost = d.cost_usd; budget();
    const status = document.getElementById('status');
    status.textContent = d.outcome; status.className = 'status-' + d.outcome;
    if (d.answer && d.outcome === 'done') {
      const last = [...document.querySelectorAll('.assistant')].pop();
      if (last && last.textContent === d.answer) last.classList.add('answer');
      else add(el('div', 'item answer', d.answer));
    }
    if (d.reason) add(el('div', 'note', d.reason));
    document.querySelectorAll('.approval button, .question button').forEach(b => b.disabled = true);
    if (state.modelCalls) forkButton(state.base + state.modelCalls);  // after its answer
  },
};
// an EventSource cannot send a header: the token goes in this request's own query
const source = new EventSource('/api/runs/' + encodeURIComponent(runId) + '/events?offset=0&token=' + encodeURIComponent(token));
source.onerror = () => api('/api/runs/' + encodeURIComponent(runId)).then((r) => {
  if (r.status === 404) document.getElementById('status').textContent = 'no such run';
});
source.onmessage = (m) => {
  const e = JSON.parse(m.data);
  if (e.type === 'end') { source.close(); document.getElementById('cancel').disabled = true; return; }
  (render[e.type] || (() => {}))(e);
};
document.getElementById('cancel').onclick = () => post('/cancel');
document.getElementById('send').addEventListener('submit', async (ev) => {
  ev.preventDefault(); const input = ev.target.elements.text;
  const r = await post('/messages', {text: input.value});
  document.getElementById('send-error').textContent = r.ok ? '' : (await r.json()).error;
  if (r.ok) input.value = '';
});
</script>
</body></html>
"""


QUESTION_FORM = """// A question's form, built from the flat schema the server sent: a field a property, typed
// as it says (a checkbox, a list of choices, a number, text), its default filled in.
function questionForm(d, answer) {  // answer(form, questionId, body) sends it
  const form = el('form', 'question'); form.dataset.questionId = d.question_id;
  form.appendChild(el('div', '', `${d.asker} asks: ${d.message}`));
  if (d.url) {
    const a = el('a', '', d.url); a.href = d.url; a.target = '_blank'; a.rel = 'noopener noreferrer';
    form.appendChild(a);
  }
  for (const [name, spec] of Object.entries((d.schema && d.schema.properties) || {})) {
    const label = el('label', '', (spec.title || name) + ' '); let input;
    if (spec.type === 'boolean') {
      input = el('input'); input.type = 'checkbox'; input.checked = spec.default === true;
    } else if (Array.isArray(spec.enum)) {
      input = el('select');
      for (const v of spec.enum) { const o = el('option', '', String(v)); o.value = v; input.appendChild(o); }
      if (spec.default !== undefined) input.value = spec.default;
    } else {
      input = el('input'); input.type = ['integer', 'number'].includes(spec.type) ? 'number' : 'text';
      if (spec.type === 'number') input.step = 'any';
      if (spec.default !== undefined) input.value = spec.default;
    }
    input.name = name; input.dataset.kind = spec.type || 'string';
    label.appendChild(input); form.appendChild(label);
  }
  const yes = el('button', 'answer', 'Answer'); yes.type = 'submit';
  const no = el('button', 'decline', 'Decline'); no.type = 'button';
  form.append(yes, ' ', no, ' ', el('span', 'note error'));
  form.onsubmit = (ev) => {
    ev.preventDefault(); const content = {};
    for (const i of form.querySelectorAll('[name]')) {
      const kind = i.dataset.kind;
      if (kind === 'boolean') content[i.name] = i.checked;
      else if (i.value === '') continue;
      else if (kind === 'integer') content[i.name] = parseInt(i.value, 10);
      else if (kind === 'number') content[i.name] = Number(i.value);
      else content[i.name] = i.value;
    }
    answer(form, d.question_id, {action: 'accept', content});
  };
  no.onclick = () => answer(form, d.question_id, {action: 'decline', reason: 'declined in the web page'});
  return form;
}
"""
"""A question's form, on a run's page and in the inbox (each sends its answer its own way)."""

AUTH = """const TOKEN_KEY = 'tether-token';
(() => {  // the link's token goes to this origin's own storage (an origin includes the port)
  const u = new URL(location.href); const t = u.searchParams.get('token');
  if (t) { localStorage.setItem(TOKEN_KEY, t); u.searchParams.delete('token'); history.replaceState(null, '', u); }
})();
const token = localStorage.getItem(TOKEN_KEY) || '';
function api(path, init) {
  init = init || {};
  init.headers = Object.assign({'Authorization': 'Bearer ' + token}, init.headers || {});
  return fetch(path, init).then((r) => { if (r.status === 401) locked(); return r; });
}
function locked() {
  document.body.replaceChildren(Object.assign(document.createElement('p'),
    {textContent: 'Open the link that tether serve printed (it holds the access token).'}));
}
if (!token) locked();
"""
"""Each page's access: the token of the link `tether serve` printed is kept in the page's own
storage (per origin, and an origin includes the port) and sent as a header, never as a
cookie, which a browser would send to every port of 127.0.0.1 (any local server the user
opens would receive it)."""


def fill(template: str, **values: Any) -> str:
    """Put already-escaped values in a page (markers look like __NAME__)."""
    out = template.replace("__STYLE__", STYLE).replace("__AUTH__", AUTH.rstrip("\n"))
    out = out.replace("__QUESTION_FORM__", QUESTION_FORM.rstrip("\n"))
    for name, value in values.items():
        out = out.replace(f"__{name.upper()}__", str(value))
    return out
