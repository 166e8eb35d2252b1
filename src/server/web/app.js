// pagellm's web page: a chat and completion playground over the OpenAI API,
// the served models, and a live view of /metrics. Plain JavaScript, no
// framework and nothing fetched from elsewhere; model output is only ever
// set as text (never as HTML).
'use strict';

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = 'pagellm.apiKey';
const params = new URLSearchParams(location.search);
const POLL_MS = Math.max(250, Number(params.get('poll')) || 2000);  // ?poll= for tests
const WINDOW_MS = 5 * 60 * 1000;

// ---- API access

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function headers() {
  const h = { 'Content-Type': 'application/json' };
  const key = localStorage.getItem(KEY_STORAGE);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorFrom(res) {
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    if (body && body.error && body.error.message) message = `${res.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  if (res.status === 401) message += ' (set the API key: the button at the top right)';
  return new ApiError(res.status, message);
}

async function getJson(path) {
  const res = await fetch(path, { headers: headers() });
  if (!res.ok) throw await errorFrom(res);
  return res.json();
}

// POSTs a streaming request and calls onEvent with each parsed SSE event.
async function stream(path, body, signal, onEvent) {
  const res = await fetch(path, { method: 'POST', headers: headers(), body: JSON.stringify(body), signal });
  if (!res.ok) throw await errorFrom(res);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of block.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        const event = JSON.parse(data);
        if (event.error) throw new ApiError(0, event.error.message || 'stream error');
        onEvent(event);
      }
    }
  }
}

function showError(message) {
  const banner = $('error');
  banner.textContent = message;
  banner.hidden = !message;
}

// ---- tabs (arrow keys move between them, Alt+1..4 jump)

const TABS = ['chat', 'completion', 'models', 'dashboard'];
function selectTab(name) {
  for (const t of TABS) {
    const tab = $(`tab-${t}`), on = t === name;
    tab.setAttribute('aria-selected', on);
    tab.tabIndex = on ? 0 : -1;
    $(`view-${t}`).hidden = !on;
  }
  document.querySelector('main').classList.toggle('wide', name === 'models' || name === 'dashboard');
  if (name === 'models') loadModels();
  if (name === 'dashboard') drawPlots();
  history.replaceState(null, '', `#${name}`);
}
TABS.forEach((t, i) => {
  const tab = $(`tab-${t}`);
  tab.addEventListener('click', () => selectTab(t));
  tab.addEventListener('keydown', (e) => {
    const step = e.key === 'ArrowRight' ? 1 : e.key === 'ArrowLeft' ? -1 : 0;
    if (!step) return;
    const next = TABS[(i + step + TABS.length) % TABS.length];
    selectTab(next);
    $(`tab-${next}`).focus();
  });
});

// ---- settings shared by chat and completion

function samplingFields() {
  const body = {};
  const num = (id) => { const v = $(id).value.trim(); return v === '' ? null : Number(v); };
  const temperature = num('temperature'), topP = num('top-p'), maxTokens = num('max-tokens'), seed = num('seed');
  if (temperature !== null) body.temperature = temperature;
  if (topP !== null) body.top_p = topP;
  if (maxTokens !== null) body.max_tokens = maxTokens;
  if (seed !== null) body.seed = seed;
  if ($('model').value) body.model = $('model').value;
  const stop = $('stop').value.split('\n').filter((line) => line !== '');
  if (stop.length) body.stop = stop;
  return body;
}

function parseJsonBox(id, what) {
  const text = $(id).value.trim();
  if (!text) return null;
  try { return JSON.parse(text); } catch (e) { throw new ApiError(0, `${what} is not valid JSON: ${e.message}`); }
}

// ---- chat

const chat = { messages: [], controller: null };

function addMessage(role, text) {
  const li = document.createElement('li');
  li.className = `msg ${role}`;
  const label = document.createElement('span');
  label.className = 'role';
  label.textContent = role;
  const content = document.createElement('span');
  content.className = 'content';
  content.textContent = text || '';
  li.append(label, content);
  $('messages').append(li);
  scrollChat(true);
  return li;
}

// Follows the newest text unless the reader scrolled up to read.
function scrollChat(force) {
  const list = $('messages');
  if (force || list.scrollHeight - list.scrollTop - list.clientHeight < 80) list.scrollTop = list.scrollHeight;
}

function renderStructured(li, text) {
  const pre = document.createElement('pre');
  pre.className = 'json';
  const badge = document.createElement('span');
  badge.className = 'badge';
  try {
    pre.textContent = JSON.stringify(JSON.parse(text), null, 2);
    badge.textContent = 'valid JSON';
  } catch (_) {
    pre.textContent = text;
    badge.textContent = 'not JSON';
    badge.classList.add('bad');
  }
  li.querySelector('.content').replaceWith(pre);
  li.querySelector('.role').append(' ', badge);
}

// "40 tokens · 75.7 tok/s · first token after 0.19 s · finish: length" for a
// reply that started at `started` (usage's count, else the chunks seen).
function replyStats({ started, usage, chunks, firstAt = 0, finish }) {
  const seconds = (performance.now() - started) / 1000;
  const tokens = usage ? usage.completion_tokens : chunks;
  const parts = [`${tokens} tokens`, `${(tokens / Math.max(seconds, 1e-3)).toFixed(1)} tok/s`];
  if (firstAt) parts.push(`first token after ${((firstAt - started) / 1000).toFixed(2)} s`);
  if (usage && usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens)
    parts.push(`${usage.prompt_tokens_details.cached_tokens} prompt tokens cached`);
  if (finish) parts.push(`finish: ${finish}`);
  return parts.join(' · ');
}

function setChatBusy(busy) {
  $('chat-send').disabled = busy;
  $('chat-stop').disabled = !busy;
}

async function sendChat() {
  const text = $('chat-input').value;
  if (!text.trim() || chat.controller) return;
  showError('');
  let schema, tools;
  try {
    schema = parseJsonBox('json-schema', 'The JSON schema');
    tools = parseJsonBox('tools', 'The tool definitions');
  } catch (e) { showError(e.message); return; }

  chat.messages.push({ role: 'user', content: text });
  addMessage('user', text);
  $('chat-input').value = '';
  const system = $('system-prompt').value.trim();
  const body = {
    ...samplingFields(),
    messages: system ? [{ role: 'system', content: system }, ...chat.messages] : chat.messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (schema) body.response_format = { type: 'json_schema', json_schema: { name: 'playground', schema, strict: true } };
  if (tools) {
    body.tools = tools;
    body.tool_choice = $('tool-choice').value;
    body.parallel_tool_calls = $('parallel-tools').checked;
  }

  const li = addMessage('assistant', '');
  const content = li.querySelector('.content');
  const toolCalls = [];
  let reasoning = null, chunks = 0, firstAt = 0, finish = '', usage = null, answer = '';
  const started = performance.now();
  chat.controller = new AbortController();
  setChatBusy(true);
  try {
    await stream('/v1/chat/completions', body, chat.controller.signal, (event) => {
      if (event.usage) usage = event.usage;
      for (const choice of event.choices || []) {
        const delta = choice.delta || {};
        if (!firstAt && (delta.content || delta.reasoning_content || delta.tool_calls)) firstAt = performance.now();
        if (delta.reasoning_content) {
          if (!reasoning) {
            reasoning = document.createElement('details');
            reasoning.className = 'reasoning';
            reasoning.open = true;
            reasoning.append(Object.assign(document.createElement('summary'), { textContent: 'reasoning' }),
              document.createElement('span'));
            content.before(reasoning);
          }
          reasoning.lastChild.textContent += delta.reasoning_content;
        }
        if (delta.content) {
          answer += delta.content;
          content.textContent = answer;
          li.dataset.chunks = ++chunks;
          scrollChat(false);
        }
        for (const call of delta.tool_calls || []) {
          const slot = toolCalls[call.index] ||= { id: call.id, type: 'function', function: { name: '', arguments: '' }, el: null };
          if (call.function && call.function.name) slot.function.name += call.function.name;
          if (call.function && call.function.arguments) slot.function.arguments += call.function.arguments;
          if (!slot.el) { slot.el = document.createElement('pre'); slot.el.className = 'tool-call'; li.append(slot.el); }
          slot.el.textContent = `${slot.function.name}(${slot.function.arguments})`;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    });
  } catch (e) {
    if (e.name !== 'AbortError') {
      li.classList.add('error');
      content.textContent = answer || e.message;
      if (!answer) { showError(e.message); chat.messages.pop(); }
    } else {
      finish = 'stopped';
    }
  } finally {
    chat.controller = null;
    setChatBusy(false);
  }
  if (li.classList.contains('error')) return;
  if (schema && answer) renderStructured(li, answer);
  const message = { role: 'assistant', content: answer };
  if (toolCalls.length) message.tool_calls = toolCalls.map(({ el, ...call }) => call);
  chat.messages.push(message);

  const meta = document.createElement('span');
  meta.className = 'meta';
  meta.textContent = replyStats({ started, usage, chunks, firstAt, finish });
  li.append(meta);
  scrollChat(false);
  li.dataset.done = 'true';
}

$('chat-form').addEventListener('submit', (e) => { e.preventDefault(); sendChat(); });
$('chat-input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); sendChat(); }
});
$('chat-stop').addEventListener('click', () => chat.controller && chat.controller.abort());
$('chat-clear').addEventListener('click', () => { chat.messages = []; $('messages').replaceChildren(); showError(''); });

// ---- completion

let completionController = null;
async function sendCompletion() {
  if (completionController) return;
  showError('');
  const prompt = $('completion-prompt').value;
  const out = $('completion-output');
  out.querySelector('.prompt').textContent = prompt;
  const generated = out.querySelector('.generated');
  generated.textContent = '';
  $('completion-stats').textContent = '';
  completionController = new AbortController();
  $('completion-send').disabled = true;
  $('completion-stop').disabled = false;
  const started = performance.now();
  let usage = null, finish = '', chunks = 0;
  try {
    await stream('/v1/completions', { ...samplingFields(), prompt, stream: true, stream_options: { include_usage: true } },
      completionController.signal, (event) => {
        if (event.usage) usage = event.usage;
        for (const choice of event.choices || []) {
          if (choice.text) { generated.textContent += choice.text; out.dataset.chunks = ++chunks; }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      });
  } catch (e) {
    if (e.name !== 'AbortError') showError(e.message); else finish = 'stopped';
  } finally {
    completionController = null;
    $('completion-send').disabled = false;
    $('completion-stop').disabled = true;
  }
  $('completion-stats').textContent = replyStats({ started, usage, chunks, finish });
}
$('completion-form').addEventListener('submit', (e) => { e.preventDefault(); sendCompletion(); });
$('completion-prompt').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); sendCompletion(); }
});
$('completion-stop').addEventListener('click', () => completionController && completionController.abort());

document.addEventListener('keydown', (e) => {
  if (e.key !== 'Escape') return;
  if (chat.controller) chat.controller.abort();
  if (completionController) completionController.abort();
});

// ---- models and server status

async function loadModels() {
  try {
    const list = await getJson('/v1/models');
    const select = $('model'), chosen = select.value;
    select.replaceChildren();
    const body = $('models-body');
    body.replaceChildren();
    for (const m of list.data) {
      select.append(new Option(m.parent ? `${m.id} (adapter of ${m.parent})` : m.id, m.id));
      const tr = document.createElement('tr');
      for (const v of [m.id, m.parent || '', m.max_model_len ?? '', m.owned_by || '']) {
        const td = document.createElement('td');
        td.textContent = v;
        tr.append(td);
      }
      body.append(tr);
    }
    if (chosen) select.value = chosen;
    $('server-status').textContent = list.data.length ? list.data[0].id : 'no model';
    $('server-status').classList.remove('down');
  } catch (e) {
    $('server-status').textContent = e.status === 401 ? 'API key needed' : 'not reachable';
    $('server-status').classList.add('down');
    showError(e.message);
  }
  try {
    const v = await getJson('/version');
    $('server-version').textContent = `pagellm ${v.version || ''}`;
  } catch (_) { /* older servers */ }
}

// ---- API key dialog

$('key-button').addEventListener('click', () => {
  $('key-input').value = localStorage.getItem(KEY_STORAGE) || '';
  $('key-dialog').showModal();
});
$('key-dialog').addEventListener('close', () => {
  const choice = $('key-dialog').returnValue;
  if (choice === 'save') localStorage.setItem(KEY_STORAGE, $('key-input').value.trim());
  if (choice === 'forget') localStorage.removeItem(KEY_STORAGE);
  if (choice === 'save' || choice === 'forget') { showError(''); loadModels(); }
});

// ---- dashboard: /metrics polled, rates from counter differences

// Prometheus text -> { name: value } with the prefix (pagellm: or vllm:)
// dropped and series of one name summed over their labels.
function parseMetrics(text) {
  const values = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const name = m[1].replace(/^(pagellm|vllm):/, '');
    if (m[2] && /le="|quantile="/.test(m[2])) continue;  // histogram buckets
    const v = Number(m[3]);
    if (Number.isFinite(v)) values[name] = (values[name] || 0) + v;
  }
  return values;
}

const samples = [];  // { t, running, waiting, kv, promptTps, genTps, ttftMs, itlMs }
let previous = null;

function meanDelta(now, before, name) {
  const dc = (now[`${name}_count`] || 0) - (before[`${name}_count`] || 0);
  return dc > 0 ? ((now[`${name}_sum`] - before[`${name}_sum`]) / dc) * 1000 : null;
}

async function pollMetrics() {
  try {
    const res = await fetch('/metrics');
    if (!res.ok) throw new Error(`${res.status}`);
    const now = { t: Date.now(), v: parseMetrics(await res.text()) };
    const v = now.v;
    const sample = { t: now.t, running: v.num_requests_running ?? 0, waiting: v.num_requests_waiting ?? 0,
      kv: (v.kv_cache_usage_perc ?? 0) * 100, promptTps: null, genTps: null, ttftMs: null, itlMs: null };
    if (previous) {
      const dt = (now.t - previous.t) / 1000;
      const rate = (name) => Math.max(0, ((v[name] || 0) - (previous.v[name] || 0)) / dt);
      sample.promptTps = rate('prompt_tokens_total');
      sample.genTps = rate('generation_tokens_total');
      sample.ttftMs = meanDelta(v, previous.v, 'time_to_first_token_seconds');
      sample.itlMs = meanDelta(v, previous.v, 'inter_token_latency_seconds');
    }
    previous = now;
    samples.push(sample);
    while (samples.length && samples[0].t < now.t - WINDOW_MS) samples.shift();
    updateGauges(sample);
    if (!$('view-dashboard').hidden) drawPlots();
  } catch (_) {
    $('server-status').textContent = 'not reachable';
    $('server-status').classList.add('down');
  }
}

function lastValue(key) {
  for (let i = samples.length - 1; i >= 0; --i) if (samples[i][key] !== null) return samples[i][key];
  return null;
}

function updateGauges(s) {
  const fmt = (v, digits, unit = '') => (v === null ? '–' : `${v.toFixed(digits)}${unit}`);
  $('g-running').textContent = s.running;
  $('g-waiting').textContent = s.waiting;
  $('g-kv').textContent = fmt(s.kv, 1, ' %');
  $('g-tps').textContent = fmt(s.genTps, 1);
  $('g-ttft').textContent = fmt(lastValue('ttftMs'), 0, ' ms');
  $('g-itl').textContent = fmt(lastValue('itlMs'), 1, ' ms');
}

// A line plot of some sample fields over the time window, on a canvas sized
// to its CSS box. Null values break the line.
function plot(canvas, series, minMax) {
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  if (!width || !height) return;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const ctx = canvas.getContext('2d');
  ctx.scale(dpr, dpr);
  const style = getComputedStyle(document.documentElement);
  const muted = style.getPropertyValue('--muted').trim(), line = style.getPropertyValue('--line').trim();
  const left = 44, right = 8, top = 18, bottom = 18;
  // The time axis grows with the data up to the whole window.
  const t1 = samples.length ? samples[samples.length - 1].t : Date.now();
  const span = Math.min(WINDOW_MS, Math.max(10000, samples.length ? t1 - samples[0].t : 0));
  const t0 = t1 - span;
  let max = minMax, points = 0;
  for (const s of samples) for (const { key } of series) if (s[key] !== null) { max = Math.max(max, s[key]); ++points; }
  max = niceCeil(max);
  ctx.font = '11px system-ui, sans-serif';
  ctx.strokeStyle = line;
  ctx.fillStyle = muted;
  ctx.lineWidth = 1;
  for (let i = 0; i <= 4; ++i) {
    const y = top + ((height - top - bottom) * i) / 4;
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(width - right, y); ctx.stroke();
    ctx.fillText(formatTick((max * (4 - i)) / 4), 4, y + 4);
  }
  ctx.fillText(span >= 60000 ? `−${(span / 60000).toFixed(span % 60000 ? 1 : 0)} min` : `−${Math.round(span / 1000)} s`,
    left, height - 4);
  ctx.fillText('now', width - right - 22, height - 4);
  const x = (t) => left + ((t - t0) / span) * (width - left - right);
  const y = (v) => top + (1 - v / max) * (height - top - bottom);
  let legendX = left;
  series.forEach(({ key, label, color }) => {
    const c = style.getPropertyValue(color).trim();
    ctx.strokeStyle = c;
    ctx.fillStyle = c;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let pen = false;
    for (const s of samples) {
      if (s[key] === null) { pen = false; continue; }
      if (pen) ctx.lineTo(x(s.t), y(s[key])); else ctx.moveTo(x(s.t), y(s[key]));
      pen = true;
    }
    ctx.stroke();
    ctx.fillText(label, legendX, 11);
    legendX += ctx.measureText(label).width + 14;
  });
  canvas.dataset.points = points;  // for the browser test: the plot drew data
}

function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}
function formatTick(v) { return v >= 100 || Number.isInteger(v) ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2); }

function drawPlots() {
  plot($('plot-requests'), [{ key: 'running', label: 'running', color: '--s1' },
    { key: 'waiting', label: 'waiting', color: '--s2' }], 4);
  plot($('plot-kv'), [{ key: 'kv', label: 'KV used %', color: '--s3' }], 10);
  plot($('plot-tokens'), [{ key: 'genTps', label: 'generated', color: '--s1' },
    { key: 'promptTps', label: 'prompt', color: '--s4' }], 10);
  plot($('plot-latency'), [{ key: 'ttftMs', label: 'TTFT', color: '--s2' }, { key: 'itlMs', label: 'ITL', color: '--s3' }], 10);
}
window.addEventListener('resize', () => { if (!$('view-dashboard').hidden) drawPlots(); });

// ---- start

$('poll-seconds').textContent = (POLL_MS / 1000).toString();
selectTab(TABS.includes(location.hash.slice(1)) ? location.hash.slice(1) : 'chat');
loadModels();
pollMetrics();
setInterval(pollMetrics, POLL_MS);
