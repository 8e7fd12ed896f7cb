"""The dashboard page of `tether serve`: runs started and ended, tokens and cost per period,
failures and halts by reason and model-call latency, over the last hour or day, and each
account's spend against its limits. The figures come from `GET /api/dashboard`
(`dashboard.figures`) and `GET /api/accounts`; the charts are SVG drawn here by a few
lines of script (no library, no CDN, no build step), each bar with its value as a tooltip and
every text through `textContent`, as on the other pages."""

from __future__ import annotations

DASHBOARD_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Tether dashboard</title>
<style nonce="__NONCE__">__STYLE__</style></head>
<body>
<h1><a href="/">Tether</a> · dashboard <span class="note"><a href="?window=hour" id="w-hour">last hour</a> ·
<a href="?window=day" id="w-day">last day</a></span></h1>
<section class="panel"><h2>Runs started and ended</h2><div class="legend" id="runs-legend"></div>
<svg class="chart" id="runs-chart" viewBox="0 0 900 170" role="img" aria-label="runs started and ended"></svg></section>
<section class="panel"><h2>Tokens</h2>
<svg class="chart" id="tokens-chart" viewBox="0 0 900 170" role="img" aria-label="tokens"></svg></section>
<section class="panel"><h2>Cost (USD)</h2>
<svg class="chart" id="cost-chart" viewBox="0 0 900 170" role="img" aria-label="cost"></svg></section>
<section class="panel"><h2>Failures and halts by reason</h2>
<table><thead><tr><th>Outcome</th><th>Reason</th><th>Runs</th></tr></thead><tbody id="reasons"></tbody></table>
<p class="note" id="no-reasons" hidden>No run failed or halted in this window.</p></section>
<section class="panel"><h2>Accounts</h2>
<table><thead><tr><th>Account</th><th>Today</th><th>This month</th><th>In all</th><th>In flight</th><th>Limits</th></tr></thead><tbody id="accounts"></tbody></table>
<p class="note" id="no-accounts" hidden>No account has limits or spend (tether limits set ACCOUNT ...).</p></section>
<section class="panel"><h2>Rate limits</h2>
<table><thead><tr><th>Endpoint and key</th><th>Rate</th><th>Its last window</th><th>Paused</th></tr></thead><tbody id="rates"></tbody></table>
<p class="note" id="no-rates" hidden>No endpoint has a rate (tether limits rate ...).</p></section>
<section class="panel"><h2>Model-call latency</h2><p id="latency" class="note"></p>
<svg class="chart" id="latency-chart" viewBox="0 0 900 90" role="img" aria-label="model-call latency percentiles"></svg></section>
<script nonce="__NONCE__">
__AUTH__
const NS = 'http://www.w3.org/2000/svg';
const windowName = new URLSearchParams(location.search).get('window') === 'day' ? 'day' : 'hour';
document.getElementById('w-' + windowName).classList.add('current');
const OUTCOMES = ['done', 'halted', 'failed', 'cancelled'];
function svg(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text; return e;
}
function when(f, i) {  // a period's start, as the axis and the tooltips say it
  const d = new Date((f.start + i * f.period_s) * 1000);
  return d.toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'});
}
// Bars per period: `groups` side by side in each period, each a stack of series
// [{name, cls, values}]; the tallest stack sets the scale, which the top-left label says.
function bars(el, f, groups, fmt) {
  // the axis's text in the viewBox's units: 11 px on a wide screen, as big on a phone's
  const fs = Math.round(11 * 900 / Math.max(300, Math.min(900, el.clientWidth || 900)));
  const W = 900, H = 170, top = fs + 6, bottom = fs + 10, n = f.started.length, slot = W / n;
  const totals = groups.flatMap(g => f.started.map((_, i) => g.reduce((a, s) => a + s.values[i], 0)));
  const max = Math.max(...totals, 0) || 1, scale = (H - top - bottom) / max;
  const axis = (x, text, anchor) => svg('text', {x: x, y: H - 4, class: 'axis', 'font-size': fs, 'text-anchor': anchor}, text);
  el.replaceChildren(svg('text', {x: 2, y: fs + 1, class: 'axis', 'font-size': fs}, 'max ' + fmt(max)));
  el.appendChild(svg('line', {x1: 0, x2: W, y1: H - bottom, y2: H - bottom, class: 'base'}));
  el.append(axis(1, when(f, 0), 'start'), axis(W / 2, when(f, n / 2), 'middle'), axis(W - 1, 'now', 'end'));
  const width = Math.max(1, slot / groups.length - 1);
  groups.forEach((g, gi) => f.started.forEach((_, i) => {
    let y = H - bottom;
    for (const s of g) {
      const v = s.values[i]; if (!v) continue;
      const h = Math.max(1, v * scale); y -= h;
      const rect = svg('rect', {x: i * slot + gi * width, y: y, width: width, height: h, class: 'c-' + s.cls});
      rect.appendChild(svg('title', {}, `${when(f, i)} · ${s.name} ${fmt(v)}`));
      el.appendChild(rect);
    }
  }));
}
function legend(el, items) {
  el.replaceChildren();
  for (const [name, cls] of items) {
    const key = document.createElement('span'); key.className = 'key c-' + cls;
    el.append(key, document.createTextNode(name + ' '));
  }
}
function latency(f) {
  const m = f.model_ms, el = document.getElementById('latency-chart');
  document.getElementById('latency').textContent = m.calls
    ? `${m.calls} model calls: p50 ${m.p50} ms · p90 ${m.p90} ms · p99 ${m.p99} ms`
    : 'No model call in this window.';
  el.replaceChildren(); if (!m.calls) return;
  ['p50', 'p90', 'p99'].forEach((p, i) => {
    const w = Math.max(1, 800 * m[p] / m.p99);
    const rect = svg('rect', {x: 40, y: 6 + i * 28, width: w, height: 20, class: 'c-latency'});
    rect.appendChild(svg('title', {}, `${p} ${m[p]} ms`));
    el.append(svg('text', {x: 2, y: 20 + i * 28, class: 'axis', 'font-size': 14}, p), rect);
  });
}
function reasons(f) {
  const body = document.getElementById('reasons'); body.replaceChildren();
  document.getElementById('no-reasons').hidden = f.reasons.length > 0;
  for (const r of f.reasons) {
    const tr = document.createElement('tr');
    for (const [text, cls] of [[r.outcome, 'status-' + r.outcome], [r.reason, ''], [r.runs, '']]) {
      const td = document.createElement('td'); td.textContent = text; td.className = cls; tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}
function money(c) { return '$' + c.usd.toFixed(4) + ' · ' + c.tokens + ' tokens'; }
function limitsText(l) {
  if (!l) return 'none';
  const said = [];
  for (const [k, v] of Object.entries(l)) if (k !== 'when_over') said.push(k.replaceAll('_', ' ') + ' ' + (k.startsWith('cost') ? '$' + v : v));
  return said.join(', ') + '; a new run over a limit: ' + l.when_over + 'd';
}
async function accounts() {
  const r = await api('/api/accounts'); if (!r.ok) return;
  const found = await r.json(), body = document.getElementById('accounts'); body.replaceChildren();
  document.getElementById('no-accounts').hidden = found.accounts.length > 0;
  for (const a of found.accounts) {
    const tr = document.createElement('tr');
    const cells = [a.account, money(a.spent.day), money(a.spent.month), money(a.spent.total), money(a.held.total), limitsText(a.limits)];
    for (const text of cells) { const td = document.createElement('td'); td.textContent = text; tr.appendChild(td); }
    if (a.refusal) { tr.className = 'status-halted'; tr.title = a.refusal; }
    body.appendChild(tr);
  }
  rates(found.rates);
}
function rateText(r) {
  if (!r) return 'none';
  const said = [r.requests && r.requests + ' requests', r.tokens && r.tokens + ' tokens'].filter(Boolean);
  return 'at most ' + said.join(' and ') + (r.per === 60 ? ' a minute' : ' in ' + r.per + ' s');
}
function rates(found) {
  const body = document.getElementById('rates'); body.replaceChildren();
  document.getElementById('no-rates').hidden = found.length > 0;
  for (const e of found) {
    const tr = document.createElement('tr');
    const paused = e.paused_for > 0 ? e.paused_for.toFixed(1) + ' s more, as the server asked' : 'no';
    const cells = [e.endpoint, rateText(e.rate), e.recent.requests + ' requests, ' + e.recent.tokens + ' tokens', paused];
    for (const text of cells) { const td = document.createElement('td'); td.textContent = text; tr.appendChild(td); }
    if (e.paused_for > 0) tr.className = 'status-halted';
    body.appendChild(tr);
  }
}
let last = null;  // the figures drawn: drawn again at the window's new size
async function refresh() {
  const r = await api('/api/dashboard?window=' + windowName); if (!r.ok) return;
  draw(last = await r.json());
  await accounts();
}
addEventListener('resize', () => { if (last) draw(last); });
function draw(f) {
  const ended = OUTCOMES.map(o => ({name: o, cls: o, values: f.ended[o]}));
  bars(document.getElementById('runs-chart'), f,
       [[{name: 'started', cls: 'started', values: f.started}], ended], String);
  legend(document.getElementById('runs-legend'), [['started', 'started'], ...OUTCOMES.map(o => ['ended ' + o, o])]);
  bars(document.getElementById('tokens-chart'), f, [[{name: 'tokens', cls: 'tokens', values: f.tokens}]], String);
  bars(document.getElementById('cost-chart'), f,
       [[{name: 'cost', cls: 'cost', values: f.cost_usd}]], (v) => '$' + v.toFixed(4));
  reasons(f); latency(f);
}
if (token) { refresh(); setInterval(refresh, 5000); }
</script>
</body></html>
"""
