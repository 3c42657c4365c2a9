// Reservations (reservations.list, per tenant for root-tenant tokens), with release, cancel and
// extend where the token may change them.

import { confirmAction } from './dialog.js';
import { h, replace, time } from './dom.js';

const LIVE = new Set(['placed', 'binding', 'active']);
const STARTED = new Set(['binding', 'active']);
const COLUMNS = ['reservation', 'tenant', 'state', 'node', 'GPUs', 'start', 'end', 'actions'];

export function renderReservations(container, data, can, actions) {
  if (!data.reservations.length) {
    replace(container, h('p', { class: 'empty' }, 'No reservations visible to this token.'));
    return;
  }
  // Newest first, as a person looks for what just happened.
  const rows = [...data.reservations].sort((a, b) => (a.createdAt < b.createdAt ? 1 : -1));
  const anyActions = rows.some((r) => can.changeReservation(r) && LIVE.has(r.state));
  const columns = anyActions ? COLUMNS : COLUMNS.slice(0, -1);
  replace(container, h('div', { class: 'scroll', tabindex: '0', role: 'region', 'aria-label': 'Reservations' },
    h('table', { class: 'reservations responsive' },
      h('caption', { class: 'visually-hidden' }, 'Reservations, newest first'),
      h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, rows.map((r) => row(r, can, actions, anyActions))))));
}

function row(r, can, actions, withActions) {
  const gpus = r.gpus || [];
  return h('tr', { dataset: { reservation: r.id, state: r.state } },
    h('th', { scope: 'row', dataset: { label: 'reservation' } }, h('span', { class: 'id' }, r.id)),
    h('td', { dataset: { label: 'tenant' } }, r.tenantId),
    h('td', { dataset: { label: 'state', field: 'state' } }, h('span', { class: `chip ${r.state}` }, r.state)),
    h('td', { dataset: { label: 'node' } }, r.nodeId ? h('span', { class: 'id' }, r.nodeId) : '—'),
    h('td', { dataset: { label: 'GPUs', field: 'gpus' }, title: gpus.join('\n') }, String(r.gpuCount)),
    h('td', { dataset: { label: 'start' } }, time(r.start)),
    h('td', { dataset: { label: 'end', field: 'end' } }, h('div', {}, time(r.end),
      r.endedAt ? h('span', { class: 'ended' }, 'ended ', time(r.endedAt)) : null)),
    withActions ? h('td', { dataset: { label: 'actions' }, class: 'actions' },
      can.changeReservation(r) && LIVE.has(r.state) ? h('span', {}, buttons(r, actions)) : null)
      : null);
}

function buttons(r, actions) {
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

function button(action, label, r, onclick) {
  return h('button', { type: 'button', class: 'action', dataset: { action, key: `${action}:${r.id}` },
    'aria-label': `${label} ${r.id}`, onclick }, label);
}
