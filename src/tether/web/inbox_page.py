"""The approvals inbox of `tether serve`: every call and question that waits for a person,
across the runs of the server and its store, the oldest run's first, a page at a time
(`GET /api/inbox`). As on the other pages, everything a model or a tool produced is shown
through `textContent`; the question form and the sign-in script are `pages`' own.
"""

from __future__ import annotations

INBOX_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Tether approvals</title>
<style nonce="__NONCE__">__STYLE__</style></head>
<body>
<h1><a href="/">Tether</a> · approvals inbox</h1>
<p class="note" id="inbox-count">Loading the calls that wait for a person...</p>
<div id="inbox"></div>
<p><button id="more" type="button" hidden>More runs' calls</button></p>
<script nonce="__NONCE__">
__AUTH__
function el(tag, cls, text) {
  const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e;
}
const inbox = document.getElementById('inbox');
const shown = new Map();  // run and approval id -> its box: kept across refreshes (a reason typed stays)
__QUESTION_FORM__
// An item's box, headed by its run (a link) and the run's task.
function itemBox(kind, a) {
  const box = el('div', 'item inbox-item ' + kind); const head = box.appendChild(el('div', ''));
  const link = head.appendChild(el('a', '', 'run ' + a.run_id));
  link.href = '/runs/' + encodeURIComponent(a.run_id);
  head.appendChild(el('span', 'note', ' ' + (a.task || ''))); return box;
}
// One question a run's tool asked a person: its run, and the form its schema makes.
function question(q) {
  const box = itemBox('question', q); box.dataset.questionId = q.question_id;
  const said = el('span', 'note said');
  box.append(questionForm(q, async (form, questionId, body) => {
    form.querySelectorAll('button').forEach(b => b.disabled = true);
    const r = await api('/api/runs/' + encodeURIComponent(q.run_id) + '/answer',
      {method: 'POST', body: JSON.stringify(Object.assign({question_id: questionId}, body)),
       headers: {'Content-Type': 'application/json'}});
    said.textContent = r.ok ? (body.action === 'accept' ? 'Answered' : 'Declined')
      : (await r.json()).error || 'refused';
  }), said);
  return box;
}
// One call waiting for a person: its run (a link) and task, the tool and its full arguments,
// Approve, and Deny with a reason. A call decided elsewhere meanwhile says so.
function item(a) {
  const box = itemBox('approval', a); box.dataset.approvalId = a.approval_id;
  box.appendChild(el('div', 'name', `${a.name} wants to run with:`));
  box.appendChild(el('pre', 'args', JSON.stringify(a.arguments, null, 2)));
  const reason = el('input'); reason.placeholder = 'reason (for a deny)'; reason.size = 40;
  const approve = el('button', 'approve', 'Approve'); const deny = el('button', 'deny', 'Deny');
  const said = el('span', 'note said');
  box.append(approve, ' ', deny, ' ', reason, ' ', said);
  const decide = async (approved) => {
    approve.disabled = deny.disabled = true;
    const body = approved ? {approval_id: a.approval_id, args_hash: a.args_hash}
      : {approval_id: a.approval_id, reason: reason.value || 'denied in the inbox'};
    const r = await api('/api/runs/' + encodeURIComponent(a.run_id) + (approved ? '/approve' : '/deny'),
      {method: 'POST', body: JSON.stringify(body), headers: {'Content-Type': 'application/json'}});
    if (r.ok) { said.textContent = approved ? 'Approved' : 'Denied'; return; }
    said.textContent = (await r.json()).error || 'refused';  // decided elsewhere, or the run ended
  };
  approve.addEventListener('click', () => decide(true));
  deny.addEventListener('click', () => decide(false));
  return box;
}
// The API gives the calls of 50 runs at a time (the oldest first) and names the next page in a
// `Link` header; the inbox reads as many pages as "More" asked for, each time it refreshes.
let pages = 1;
async function fetchWaiting() {
  let url = '/api/inbox?limit=50', all = [];
  for (let n = 0; url && n < pages; n++) {
    const r = await api(url); if (!r.ok) return null;
    all = all.concat(await r.json());
    const next = /<([^>]+)>; *rel="next"/.exec(r.headers.get('Link') || '');
    url = next ? next[1] : null;
  }
  document.getElementById('more').hidden = !url;
  return all;
}
document.getElementById('more').addEventListener('click', () => { pages += 1; refresh(); });
async function refresh() {
  const waiting = await fetchWaiting(); if (waiting === null) return;
  const key = (a) => a.run_id + ' ' + (a.kind === 'question' ? 'q ' + a.question_id : a.approval_id);
  const ids = new Set(waiting.map(key));  // an approval's id is its call's: unique in its run
  for (const [id, box] of shown) if (!ids.has(id) && !box.querySelector('.said').textContent) {
    box.remove(); shown.delete(id);
  }
  for (const a of waiting) {  // in the API's order (appending a box that is there moves it)
    if (!shown.has(key(a))) shown.set(key(a), a.kind === 'question' ? question(a) : item(a));
    inbox.appendChild(shown.get(key(a)));
  }
  const calls = waiting.filter(a => a.kind !== 'question').length, asked = waiting.length - calls;
  const count = (n, one) => n ? `${n} ${one}${n === 1 ? '' : 's'}` : '';
  const what = [count(calls, 'call'), count(asked, 'question')].filter(Boolean).join(' and ');
  document.getElementById('inbox-count').textContent = !waiting.length ? 'No call waits for a person.'
    : `${what} ${waiting.length === 1 ? 'waits' : 'wait'} for a person, the oldest run's first.`;
}
if (token) { refresh(); setInterval(refresh, 1000); }
</script>
</body></html>
"""
