// Agent-Reach dashboard: renders one tenant's state, kept live by server-sent events from
// the control service (/api/events). Plain module, no dependencies; every value reaches
// the page as text nodes, never as HTML.

const $ = (sel) => document.querySelector(sel);
let state = null;
let source = null;
let searchTimer = null;
let searchResult = null;
let traceQuery = '';
let session = null;
let editing = null;
// The policy whose deletion awaits confirmation (`kind/name`), and the last deletion's outcome.
let confirming = null;
let deleted = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'onclick') node.addEventListener('click', v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const tenant = () => $('#tenant').value || 'default';
const stateBadge = (s) => el('span', { class: `state state-${s}` }, s);
const tags = (caps) => caps.map((c) => el('span', { class: 'tag' }, c.tags && c.tags.length ? `${c.name}[${c.tags.join(',')}]` : c.name));
const time = (ms) => (ms ? new Date(ms).toLocaleString() : '');
const ago = (ms) => {
  if (!ms) return '';
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  return s < 60 ? `${s}s ago` : s < 3600 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
};
const holdText = (holds) => (holds || []).map((h) => `${h.state} by operator (${h.scope.toLowerCase()}): ${h.reason || 'no reason'}`).join('; ');

function table(headers, rows) {
  return el('table', {}, el('thead', {}, el('tr', {}, headers.map((h) => el('th', {}, h)))), el('tbody', {}, rows));
}

// What the filters let through.
function matches(instance) {
  const wanted = $('#state-filter').value;
  if (wanted && instance.state !== wanted) return false;
  const q = $('#search').value.trim().toLowerCase();
  if (!q) return true;
  const reg = instance.registration;
  return reg.agent.toLowerCase().includes(q) || reg.capabilities.some((c) => c.name.toLowerCase().includes(q));
}

function viewAgents() {
  const shown = new Set(state.instances.filter(matches).map((i) => i.registration.agent));
  const rows = state.agents.filter((a) => shown.has(a.agent)).map((a) =>
    el('tr', { 'data-agent': a.agent, class: 'clickable', onclick: () => { $('#search').value = a.agent; location.hash = '#/instances'; } },
      el('td', {}, a.agent),
      el('td', {}, a.versions.join(', ')),
      el('td', {}, tags(a.capabilities)),
      el('td', { class: 'instances' }, a.instances),
      el('td', {}, Object.entries(a.instances_by_state).map(([s, n]) => el('span', {}, stateBadge(s), ` ${n} `))),
      el('td', {}, a.hold ? `${a.hold.state}: ${a.hold.reason}` : '')));
  return [el('h2', {}, `Agents (${rows.length})`), table(['Agent', 'Versions', 'Capabilities', 'Instances', 'States', 'Hold'], rows)];
}

function viewInstances() {
  const rows = state.instances.filter(matches).map((i) =>
    el('tr', { 'data-instance': i.instance_id, class: 'clickable', onclick: () => { location.hash = `#/instance/${encodeURIComponent(i.instance_id)}`; } },
      el('td', {}, i.instance_id),
      el('td', {}, i.registration.agent),
      el('td', {}, i.registration.version),
      el('td', { class: 'state-cell' }, stateBadge(i.state), i.reported_state !== i.state ? el('span', { class: 'muted' }, ` reports ${i.reported_state}`) : null),
      el('td', {}, `${Math.round(i.load.load_ratio * 100)}% · ${i.load.in_flight} in flight`),
      el('td', {}, tags(i.registration.capabilities)),
      el('td', {}, i.sidecar_id, el('div', { class: 'muted' }, i.sidecar_address)),
      el('td', {}, ago(i.registered_at_ms)),
      el('td', { class: 'heartbeat' }, ago(state.last_heartbeats[i.instance_id])),
      el('td', { class: 'hold' }, holdText(i.holds))));
  return [el('h2', {}, `Instances (${rows.length})`),
    table(['Instance', 'Agent', 'Version', 'State', 'Load', 'Capabilities', 'Sidecar', 'Registered', 'Last heartbeat', 'Hold'], rows)];
}

function viewInstance(id) {
  const i = state.instances.find((x) => x.instance_id === id);
  if (!i) return [el('h2', {}, `Instance ${id}`), el('p', { class: 'muted' }, 'Not registered (any more).')];
  const reg = i.registration;
  const rows = [
    ['Instance', i.instance_id], ['Agent', reg.agent], ['Version', reg.version], ['State', stateBadge(i.state)],
    ['Reported state', i.reported_state], ['Hold', holdText(i.holds) || 'none'],
    ['Load', `ratio ${i.load.load_ratio.toFixed(2)}, ${i.load.in_flight} in flight, queue ${i.load.queue_length}, avg ${i.load.avg_latency_ms} ms`],
    ['Capabilities', tags(reg.capabilities)], ['Endpoint', `${reg.endpoint} (${reg.transport})`],
    ['Max concurrency', reg.max_concurrency || 'unlimited'], ['Sidecar', `${i.sidecar_id} at ${i.sidecar_address}`],
    ['Registered', `${time(i.registered_at_ms)} (generation ${i.generation})`], ['Record revision', i.revision],
    ['Last heartbeat', state.last_heartbeats[i.instance_id] ? `${time(state.last_heartbeats[i.instance_id])} (${ago(state.last_heartbeats[i.instance_id])})` : 'not reported yet'],
    ['Breaker open in', (state.open_breakers[i.instance_id] || []).join(', ') || 'no caller'],
    ['Metadata', el('pre', {}, JSON.stringify(reg.metadata || {}, null, 2))],
  ];
  return [el('h2', {}, `Instance ${id}`), el('dl', { id: 'instance-details' }, rows.map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]))];
}

const mayEdit = () => Boolean(session && session.may_edit);
// A spec as JSON without the fields left at their defaults (null).
const specJson = (spec) => JSON.stringify(spec, (k, v) => (v === null ? undefined : v), 2);

// The view shown, and its argument: `#/instance/x` → ['instance', 'x'].
const currentView = () => location.hash.replace(/^#\//, '').split('/');

function startEditing(p) {
  editing = JSON.stringify({ kind: p.kind, name: p.name, description: p.description || '', spec: JSON.parse(specJson(p.spec)) }, null, 2);
  $('#view').replaceChildren(...(currentView()[0] === 'alerts' ? viewAlerts() : viewPolicies()).filter((x) => x));
}

// Deletes a policy once its row's confirmation is clicked.
async function deletePolicy(p) {
  const response = await fetch(`/api/policies/delete?tenant=${encodeURIComponent(tenant())}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ kind: p.kind, name: p.name }),
  });
  const answer = await response.json();
  confirming = null;
  deleted = response.ok
    ? { good: true, text: `Deleted ${p.kind} policy ${p.name} at revision ${answer.revision}.` }
    : { good: false, text: answer.error };
  render();
}

function policyActions(p) {
  const key = `${p.kind}/${p.name}`;
  if (confirming === key) {
    return el('td', { class: 'confirm' }, `Delete the ${p.kind} policy ${p.name}? `,
      el('button', { type: 'button', class: 'confirm-delete danger', onclick: () => deletePolicy(p) }, 'Yes, delete'),
      el('button', { type: 'button', class: 'cancel-delete', onclick: () => { confirming = null; render(); } }, 'Cancel'));
  }
  return el('td', {},
    el('button', { type: 'button', class: 'edit-policy', onclick: () => startEditing(p) }, 'Edit'), ' ',
    el('button', { type: 'button', class: 'delete-policy', onclick: () => { confirming = key; deleted = null; render(); } }, 'Delete'));
}

// Sends the editor's policy to `path` (validate or save); shows what came back.
async function sendPolicy(path) {
  const text = $('#policy-json').value;
  const result = $('#policy-result');
  let body;
  try { body = JSON.parse(text); } catch (e) { result.className = 'bad'; result.textContent = `Not JSON: ${e.message}`; return; }
  const response = await fetch(`${path}?tenant=${encodeURIComponent(tenant())}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  const answer = await response.json();
  if (!response.ok || answer.valid === false) { result.className = 'bad'; result.textContent = answer.error; return; }
  result.className = 'good';
  result.textContent = path.endsWith('/validate') ? 'Valid.' : `Saved at revision ${answer.revision}.`;
  if (!path.endsWith('/validate')) editing = null;
}

function policyEditor() {
  const area = el('textarea', { id: 'policy-json', rows: 16, spellcheck: 'false' });
  area.value = editing;
  return el('section', { id: 'policy-editor' },
    el('h3', {}, 'Edit policy (JSON: kind, name, description, spec)'), area,
    el('div', { class: 'buttons' },
      el('button', { type: 'button', id: 'policy-validate', onclick: () => sendPolicy('/api/policies/validate') }, 'Validate'),
      el('button', { type: 'button', id: 'policy-save', onclick: () => sendPolicy('/api/policies') }, 'Save'),
      el('button', { type: 'button', id: 'policy-close', onclick: () => { editing = null; $('#policy-editor').remove(); render(); } }, 'Close'),
      el('span', { id: 'policy-result' })));
}

function viewPolicies() {
  const edit = mayEdit();
  const rows = state.policies.map((p) =>
    el('tr', { 'data-policy': `${p.kind}/${p.name}` }, el('td', {}, p.kind), el('td', {}, p.name), el('td', {}, p.description || ''),
      el('td', { class: 'spec' }, el('pre', {}, specJson(p.spec))), el('td', {}, p.revision),
      edit ? policyActions(p) : null));
  const headers = ['Kind', 'Name', 'Description', 'Spec', 'Revision'].concat(edit ? [''] : []);
  const create = edit ? el('button', { type: 'button', id: 'policy-new',
    onclick: () => startEditing({ kind: 'capability', name: '', description: '', spec: {} }) }, 'New policy') : null;
  const outcome = deleted ? el('p', { id: 'policy-deleted', class: deleted.good ? 'good' : 'bad' }, deleted.text) : null;
  return [el('h2', {}, `Policies (${rows.length})`, ' ', create), editing !== null ? policyEditor() : null, outcome,
    table(headers, rows), edit ? null : el('p', { class: 'muted' }, 'Viewing only: an operator token edits policies.')];
}

const pct = (x) => `${(x * 100).toFixed(1)}%`;

function viewTopology() {
  const rows = state.topology.map((e) =>
    el('tr', { 'data-edge': `${e.caller}>${e.agent}`, class: e.error_ratio > 0 ? 'edge-errors' : '' },
      el('td', {}, e.caller), el('td', { class: 'arrow' }, '→'), el('td', {}, e.agent), el('td', { class: 'muted' }, e.target),
      el('td', { class: 'rate' }, e.calls_per_s.toFixed(2)), el('td', { class: 'calls' }, e.calls),
      el('td', { class: 'errors' }, pct(e.error_ratio)), el('td', { class: 'p99' }, e.p99_ms === null ? '' : `≤ ${e.p99_ms} ms`),
      el('td', {}, e.fallback_calls || ''), el('td', { class: 'sidecars' }, e.sidecars.join(', '))));
  const reporting = state.sidecars.map((s) => `${s.sidecar_id} (${ago(s.received_at_ms)})`).join(', ') || 'none yet';
  return [el('h2', {}, `Call topology, last minute (${rows.length} edges)`),
    table(['Caller', '', 'Served by', 'Target', 'Calls/s', 'Calls', 'Errors', 'p99', 'Fallback', 'Reported by'], rows),
    el('p', { class: 'muted' }, `Sidecars reporting: ${reporting}`)];
}

// A link to the trace in the configured tracing backend (control's --dashboard-trace-url), if any.
function backendLink(traceId) {
  const template = session && session.trace_url;
  if (!template) return null;
  return el('a', { class: 'trace-backend', href: template.split('{trace_id}').join(encodeURIComponent(traceId)),
    target: '_blank', rel: 'noopener noreferrer' }, 'open in the tracing backend');
}

function traceRows(found) {
  if (!found.traces.length) return [el('p', { class: 'muted', id: 'trace-none' }, `No recent trace with id or session ${found.query}.`)];
  return found.traces.map((t) => el('section', { class: 'trace', 'data-trace': t.trace_id },
    el('h3', {}, `Trace ${t.trace_id}`, t.session ? ` · session ${t.session}` : '', ` · ${(t.duration_us / 1000).toFixed(2)} ms · ${time(t.start_unix_us / 1000)}`),
    backendLink(t.trace_id),
    table(['Span', 'Sidecar', 'Start', 'Duration', 'Status', 'Instance'], t.spans.map((s) =>
      el('tr', { 'data-span': s.span_id },
        el('td', { class: 'span-name' }, '· '.repeat(s.depth), s.name),
        el('td', {}, s.sidecar_id),
        el('td', {}, `+${((s.start_unix_us - t.start_unix_us) / 1000).toFixed(2)} ms`),
        el('td', { class: 'duration' }, `${(s.duration_us / 1000).toFixed(2)} ms`),
        el('td', {}, s.status),
        el('td', {}, s.attributes['agent_reach.instance'] || ''))))));
}

async function findTraces(q) {
  traceQuery = q.trim();
  if (!traceQuery) { $('#trace-results').replaceChildren(); return; }
  const response = await fetch(`/api/traces?tenant=${encodeURIComponent(tenant())}&q=${encodeURIComponent(traceQuery)}`);
  if (!response.ok) return;
  $('#trace-results').replaceChildren(...traceRows(await response.json()));
}

function viewTraces() {
  const input = el('input', { id: 'trace-query', type: 'search', placeholder: 'Trace id or session id', value: traceQuery, autocomplete: 'off' });
  const form = el('form', { id: 'trace-form' }, input, el('button', { type: 'submit' }, 'Find'));
  form.addEventListener('submit', (e) => { e.preventDefault(); findTraces(input.value); });
  if (traceQuery) setTimeout(() => findTraces(traceQuery), 0);
  return [el('h2', {}, 'Recent traces'), el('p', { class: 'muted' }, 'From the span summaries the sidecars send with their reports (the newest spans of each).'),
    form, el('div', { id: 'trace-results' })];
}

function viewTenants() {
  const names = [...$('#tenant').options].map((o) => o.value);
  return [el('h2', {}, `Tenants (${names.length})`), table(['Tenant', ''], names.map((n) =>
    el('tr', { 'data-tenant': n }, el('td', {}, n), el('td', {}, n === tenant() ? 'shown' : el('a', { href: '#/agents', onclick: () => switchTenant(n) }, 'show')))))];
}

function viewAlerts() {
  const rows = state.alerts.map((a) =>
    el('tr', { 'data-alert': a.rule, class: a.resolved_at_ms ? '' : 'alert-firing' },
      el('td', {}, a.resolved_at_ms ? 'resolved' : 'firing'), el('td', {}, a.rule), el('td', {}, a.agent),
      el('td', { class: 'message' }, a.message), el('td', {}, a.instances.join(', ')), el('td', {}, time(a.fired_at_ms))));
  return [el('h2', {}, `Alerts (${rows.length})`), table(['Status', 'Rule', 'Agent', 'Message', 'Instances', 'Fired'], rows),
    ...viewThresholds()];
}

// A threshold in force, and where it comes from.
const setting = (s, unit = '') => el('span', { class: `source-${s.source}` }, `${s.value}${unit}`,
  el('span', { class: 'muted' }, s.source === 'own' ? ' (policy)' : s.source === 'tenant' ? ' (tenant policy)' : ' (default)'));

// Opens the editor on the policy that sets a row's thresholds (a new one if it has none).
function editThresholds(row) {
  const existing = state.policies.find((p) => p.kind === row.kind && p.name === row.name);
  const policy = existing || { kind: row.kind, name: row.name, description: '', spec: {} };
  const spec = JSON.parse(specJson(policy.spec));
  if (!spec.alerts) {
    spec.alerts = row.kind === 'capability' ? { fallback_calls: row.fallback_calls.value }
      : { min_healthy: row.min_healthy.value, lost_count: row.lost_count.value, lost_window_ms: row.lost_window_ms.value,
        fallback_calls: row.fallback_calls.value, breakers_open_percent: row.breakers_open_percent.value };
  }
  startEditing({ ...policy, spec });
}

function viewThresholds() {
  const edit = mayEdit();
  const rows = state.alert_thresholds.map((t) =>
    el('tr', { 'data-thresholds': `${t.kind}/${t.name}` }, el('td', {}, t.kind), el('td', {}, t.name),
      el('td', { class: 'min-healthy' }, t.kind === 'capability' ? '' : setting(t.min_healthy)),
      el('td', { class: 'lost' }, t.kind === 'capability' ? '' : [setting(t.lost_count), ' within ', setting(t.lost_window_ms, ' ms')]),
      el('td', { class: 'fallback-calls' }, setting(t.fallback_calls)),
      el('td', { class: 'breakers' }, t.kind === 'capability' ? '' : setting(t.breakers_open_percent, '%')),
      edit ? el('td', {}, el('button', { type: 'button', class: 'edit-thresholds', onclick: () => editThresholds(t) }, 'Edit')) : null));
  const headers = ['Policy kind', 'Name', 'Min healthy', 'Lost together', 'Fallback calls/min', 'Breakers open over'].concat(edit ? [''] : []);
  return [el('h2', {}, 'Alert thresholds'),
    el('p', { class: 'muted' }, "Set by each policy's spec.alerts; an agent's own policy over the tenant policy over control's flags."),
    editing !== null ? policyEditor() : null, table(headers, rows)];
}

function render() {
  const [view, arg] = currentView();
  const name = view || 'agents';
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', a.dataset.view === name);
  const firing = state ? state.alerts.filter((a) => !a.resolved_at_ms).length : 0;
  $('#alert-count').textContent = firing ? `(${firing})` : '';
  if (!state) return;
  const views = { agents: viewAgents, instances: viewInstances, topology: viewTopology, traces: viewTraces, policies: viewPolicies, tenants: viewTenants, alerts: viewAlerts };
  // The traces view keeps its form, and the policy editor its text, across live updates.
  if (!(name === 'traces' && $('#trace-form')) && !((name === 'policies' || name === 'alerts') && $('#policy-editor'))) {
    const content = name === 'instance' ? viewInstance(decodeURIComponent(arg || '')) : (views[name] || viewAgents)();
    $('#view').replaceChildren(...content.filter((x) => x));
  }
  $('#status').textContent = `tenant ${state.tenant} · revision ${state.revision} · updated ${new Date(state.generated_at_ms).toLocaleTimeString()}`;
}

function connect() {
  if (source) source.close();
  state = null;
  $('#view').replaceChildren(el('p', { class: 'muted' }, 'Loading…'));
  source = new EventSource(`/api/events?tenant=${encodeURIComponent(tenant())}`);
  source.addEventListener('state', (e) => {
    state = JSON.parse(e.data);
    $('#live').textContent = 'live';
    $('#live').className = 'live on';
    render();
  });
  source.addEventListener('error', () => {
    $('#live').textContent = 'reconnecting';
    $('#live').className = 'live off';
  });
}

function switchTenant(name) {
  $('#tenant').value = name;
  connect();
}

async function search() {
  const q = $('#search').value.trim();
  render();
  if (!q) { $('#suggestions').replaceChildren(); return; }
  const response = await fetch(`/api/search?tenant=${encodeURIComponent(tenant())}&q=${encodeURIComponent(q)}`);
  if (!response.ok) return;
  searchResult = await response.json();
  $('#search-list').replaceChildren(...[...searchResult.capabilities, ...searchResult.agents].map((n) => el('option', { value: n })));
  $('#suggestions').replaceChildren(...(searchResult.suggestions.length
    ? ['No match. Did you mean', ...searchResult.suggestions.map((s) => el('button', { type: 'button', onclick: () => { $('#search').value = s; search(); } }, s))]
    : []));
}

function showLogin(message) {
  if (source) source.close();
  $('#who').replaceChildren();
  const input = el('input', { id: 'login-token', type: 'password', autocomplete: 'off', placeholder: 'Operator token' });
  const form = el('form', { id: 'login' }, el('h2', {}, 'Log in'),
    el('p', { class: 'muted' }, 'With an Admin token: viewer to see, operator to edit policies. It is kept in an HttpOnly cookie.'),
    input, el('button', { type: 'submit' }, 'Log in'), el('p', { id: 'login-error', class: 'bad' }, message || ''));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const response = await fetch('/api/login', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ token: input.value }) });
    input.value = '';
    if (response.ok) start();
    else showLogin((await response.json()).error);
  });
  $('#view').replaceChildren(form);
}

async function logout() {
  if (source) source.close();
  await fetch('/api/logout', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
  // A fresh page: nothing of the last session stays in memory.
  location.reload();
}

let wired = false;

async function start() {
  const who = await fetch('/api/session');
  session = who.ok ? await who.json() : null;
  if (!session || !session.authenticated) { showLogin(''); return; }
  $('#who').replaceChildren(`${session.name} (${session.role})`,
    ...(session.login ? [el('button', { type: 'button', id: 'logout', onclick: logout }, 'Log out')] : []));
  const response = await fetch('/api/tenants');
  const { tenants } = response.ok ? await response.json() : { tenants: ['default'] };
  $('#tenant').replaceChildren(...tenants.map((t) => el('option', { value: t }, t)));
  if (!wired) {
    wired = true;
    $('#tenant').addEventListener('change', connect);
    $('#state-filter').addEventListener('change', render);
    $('#search').addEventListener('input', () => { clearTimeout(searchTimer); searchTimer = setTimeout(search, 200); });
    window.addEventListener('hashchange', () => { editing = null; confirming = null; deleted = null; render(); });
  }
  connect();
}

start();
