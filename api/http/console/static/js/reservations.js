// Reservations (reservations.list, per tenant for root-tenant tokens), searched, filtered and
// sorted in the page (the view's query: #/reservations?q=…&state=…&pool=…&sort=…), with
// release, cancel and extend where the token may change them.

import { confirmAction } from './dialog.js';
import { h, link, replace, time } from './dom.js';
import { href } from './route.js';

const LIVE = new Set(['placed', 'binding', 'active']);
const STARTED = new Set(['binding', 'active']);

/** The state filter: value -> [label, states (none: every state)]. */
export const STATE_FILTERS = {
  '': ['every state', []],
  live: ['live (queued, placed, binding, active)', ['queued', 'placed', 'binding', 'active']],
  ended: ['ended (released, cancelled, failed, expired)', ['released', 'cancelled', 'failed', 'expired']],
  ...Object.fromEntries(['queued', 'placed', 'binding', 'active', 'released', 'cancelled', 'failed',
    'expired'].map((s) => [s, [s, [s]]])),
};

// Sortable columns: name -> the value compared (the id's order is the creation's, as the
// server lists them).
const COLUMNS = [
  ['reservation', (r) => r.createdAt],
  ['tenant', (r) => r.tenantId],
  ['state', (r) => r.state],
  ['node', (r) => r.nodeId || ''],
  ['GPUs', (r) => r.gpuCount],
  ['start', (r) => r.start || ''],
  ['end', (r) => r.endedAt || r.end || ''],
];
const DEFAULT_SORT = '-reservation'; // newest first, as a person looks for what just happened

function compare(a, b) {
  if (typeof a === 'number' && typeof b === 'number') return a - b;
  return String(a ?? '').localeCompare(String(b ?? ''), undefined, { numeric: true });
}

/** The sort of `params.sort` ('-start': by start, latest first) as [column, descending]. */
export function sortOf(params) {
  const text = params.sort || DEFAULT_SORT;
  const name = text.replace(/^-/, '');
  return COLUMNS.some(([c]) => c === name) ? [name, text.startsWith('-')] : ['reservation', true];
}

function haystack(r, pools) {
  const pool = pools.get(r.poolId);
  return [r.id, r.tenantId, r.state, r.nodeId, r.poolId, pool?.name, pool?.key, r.key,
    r.allocationId, ...(r.gpus || [])].filter(Boolean).join(' ').toLowerCase();
}

/** The reservations `params` ({q, state, pool, sort}) selects, in its order. */
export function selectReservations(data, params) {
  const pools = new Map(data.pools.map((p) => [p.id, p]));
  const words = String(params.q || '').toLowerCase().split(/\s+/).filter(Boolean);
  const states = (STATE_FILTERS[params.state] || STATE_FILTERS[''])[1];
  const [column, descending] = sortOf(params);
  const key = COLUMNS.find(([c]) => c === column)[1];
  return data.reservations
    .filter((r) => !states.length || states.includes(r.state))
    .filter((r) => !params.pool || r.poolId === params.pool)
    .filter((r) => {
      const text = haystack(r, pools);
      return words.every((w) => text.includes(w));
    })
    .sort((a, b) => (descending ? -1 : 1) * (compare(key(a), key(b)) || compare(a.id, b.id)));
}

/** The list; `setSort(value)` changes the order (the column headers are its buttons). */
export function renderReservations(container, data, can, actions, params = {}, setSort = () => {}) {
  if (!data.reservations.length) {
    replace(container, h('p', { class: 'empty' }, 'No reservations visible to this token.'));
    return 0;
  }
  const rows = selectReservations(data, params);
  if (!rows.length) {
    replace(container, h('p', { class: 'empty' }, 'No reservation matches the search and filters.'));
    return 0;
  }
  const anyActions = rows.some((r) => can.changeReservation(r) && LIVE.has(r.state));
  const [column, descending] = sortOf(params);
  const headers = COLUMNS.map(([name]) => {
    const sorted = name === column;
    const next = sorted && !descending ? `-${name}` : name;
    return h('th', { scope: 'col', 'aria-sort': sorted ? (descending ? 'descending' : 'ascending') : null },
      h('button', { type: 'button', class: 'sort', dataset: { sort: name, key: `sort:${name}` },
        onclick: () => setSort(next === DEFAULT_SORT ? '' : next) },
      name, h('span', { class: 'sort-mark', 'aria-hidden': 'true' }, sorted ? (descending ? ' ▼' : ' ▲') : '')));
  });
  replace(container, h('div', { class: 'scroll', tabindex: '0', role: 'region', 'aria-label': 'Reservations' },
    h('table', { class: 'reservations responsive' },
      h('caption', { class: 'visually-hidden' },
        `Reservations, by ${column}, ${descending ? 'descending' : 'ascending'}`),
      h('thead', {}, h('tr', {}, headers, anyActions ? h('th', { scope: 'col' }, 'actions') : null)),
      h('tbody', {}, rows.map((r) => row(r, can, actions, anyActions))))));
  return rows.length;
}

function row(r, can, actions, withActions) {
  const gpus = r.gpus || [];
  return h('tr', { dataset: { reservation: r.id, state: r.state } },
    h('th', { scope: 'row', dataset: { label: 'reservation' } },
      link(href('reservations', r.id), h('span', { class: 'id' }, r.id))),
    h('td', { dataset: { label: 'tenant' } }, r.tenantId),
    h('td', { dataset: { label: 'state', field: 'state' } }, h('span', { class: `chip ${r.state}` }, r.state)),
    h('td', { dataset: { label: 'node' } },
      r.nodeId ? link(href('nodes', r.nodeId), h('span', { class: 'id' }, r.nodeId)) : '—'),
    h('td', { dataset: { label: 'GPUs', field: 'gpus' }, title: gpus.join('\n') }, String(r.gpuCount)),
    h('td', { dataset: { label: 'start' } }, time(r.start)),
    h('td', { dataset: { label: 'end', field: 'end' } }, h('div', {}, time(r.end),
      r.endedAt ? h('span', { class: 'ended' }, 'ended ', time(r.endedAt)) : null)),
    withActions ? h('td', { dataset: { label: 'actions' }, class: 'actions' },
      can.changeReservation(r) && LIVE.has(r.state) ? h('span', {}, reservationButtons(r, actions)) : null)
      : null);
}

/** Release or cancel, and extend, for a live reservation the token may change. */
export function reservationButtons(r, actions) {
  const api = actions.app.api;
  const out = [];
  if (STARTED.has(r.state)) {
    out.push(button('release', 'Release', r, () => confirmAction({
      title: `Release ${r.id}`,
      text: 'End this reservation now: its GPUs go back to the pool and the hold leaves the node.',
      ok: 'Release',
      run: () => api.call('reservations.release', { reservationId: r.id, tenantId: r.tenantId }),
      done: actions.refreshSoon,
    })));
  } else {
    out.push(button('cancel', 'Cancel', r, () => confirmAction({
      title: `Cancel ${r.id}`,
      text: 'Withdraw this reservation before its start; nothing is held.',
      ok: 'Cancel reservation',
      run: () => api.call('reservations.cancel', { reservationId: r.id, tenantId: r.tenantId }),
      done: actions.refreshSoon,
    })));
  }
  out.push(button('extend', 'Extend', r, () => confirmAction({
    title: `Extend ${r.id}`,
    text: 'Move its end later, when its GPUs are free for the extra time.',
    ok: 'Extend',
    fields: [{ name: 'by', label: 'By (a duration: 30m, 2h, 1d)', value: '1h' }],
    run: (v) => api.call('reservations.extend', { reservationId: r.id, by: v.by, tenantId: r.tenantId }),
    done: actions.refreshSoon,
  })));
  return out;
}

export function isLive(r) {
  return LIVE.has(r.state);
}

function button(action, label, r, onclick) {
  return h('button', { type: 'button', class: 'action', dataset: { action, key: `${action}:${r.id}` },
    'aria-label': `${label} ${r.id}`, onclick }, label);
}
