// The page of one object (#/reservations/rsv_…, #/nodes/node_…, #/pools/pool_…): what the
// list shows of it, every field as nested fields (as `kubectl describe` prints one), its
// events for a reservation, and the API's answer one click away.

import { describe, h, link, rawJson, replace } from './dom.js';
import { eventItem } from './events.js';
import { holdersOf, hostname, nodeCard } from './nodes.js';
import { poolCard } from './pools.js';
import { isLive, reservationButtons } from './reservations.js';
import { href } from './route.js';

const EVENTS = 100; // a reservation's events shown (it has a dozen or so)
const NAMES = { pools: 'Pools', nodes: 'Nodes', reservations: 'Reservations' };

/** What the page of `route` needs beyond the views' data (the reservation and its events). */
export async function loadObject(api, route) {
  if (route.view !== 'reservations') return null;
  const [doc, page] = await Promise.all([
    api.call('reservations.get', { reservationId: route.id }),
    api.call('events.list', { subject: route.id, limit: EVENTS }),
  ]);
  return { doc, events: page.events };
}

/** Fill the object view (its back link, heading and body); `ctx` = {can, actions, charts}. */
export function renderObject(parts, route, object, data, ctx) {
  parts.back.textContent = NAMES[route.view];
  parts.back.setAttribute('href', href(route.view));
  const found = find(route, object, data, ctx);
  if (!found) {
    replace(parts.title, route.id);
    parts.body.replaceChildren(h('p', { class: 'empty', dataset: { missing: route.id } },
      `No ${route.view.replace(/s$/, '')} ${route.id} is visible to this token.`));
    return;
  }
  replace(parts.title, found.title); // a pool's or node's name: text, by dom.js's rule
  parts.body.replaceChildren(h('div', { class: 'object', dataset: { object: route.id } }, found.body));
}

function find(route, object, data, ctx) {
  if (route.view === 'pools') {
    const pool = data.pools.find((p) => p.id === route.id);
    if (!pool) return null;
    return { title: `Pool ${pool.name || pool.key || pool.id}`,
      body: [poolCard(pool, data, ctx.charts), rawJson(pool, 'Pool JSON'),
        data.capacity.get(pool.id) ? rawJson(data.capacity.get(pool.id), 'Capacity JSON') : null] };
  }
  if (route.view === 'nodes') {
    const node = data.nodes.find((n) => n.id === route.id);
    if (!node) return null;
    return { title: `Node ${hostname(node)}`,
      body: [nodeCard(node, holdersOf(data.reservations), ctx.can, ctx.actions), rawJson(node, 'Node JSON')] };
  }
  if (!object?.doc) return null;
  const r = object.doc;
  return { title: `Reservation ${r.id}`, body: reservation(r, object.events, data, ctx) };
}

function reservation(r, events, data, ctx) {
  const pool = data.pools.find((p) => p.id === r.poolId);
  return [
    h('article', { class: 'card' },
      h('ul', { class: 'chips', 'aria-label': 'state' },
        h('li', { class: `chip ${r.state}`, dataset: { field: 'state' } }, r.state)),
      h('p', { class: 'meta' }, `${r.gpuCount} GPU${r.gpuCount === 1 ? '' : 's'} of pool `,
        link(href('pools', r.poolId), pool ? (pool.name || pool.key || r.poolId) : r.poolId),
        r.nodeId ? [' on node ', link(href('nodes', r.nodeId), h('span', { class: 'id' }, r.nodeId))] : '',
        ` · tenant ${r.tenantId}`),
      ctx.can.changeReservation(r) && isLive(r) ? h('p', { class: 'row' }, reservationButtons(r, ctx.actions)) : null,
      describe(r)),
    h('h2', {}, 'Events'),
    events.length ? h('ol', { class: 'feed', 'aria-label': `Events of ${r.id}, newest first` },
      [...events].reverse().map((e) => eventItem(e))) : h('p', { class: 'empty' }, 'No events visible.'),
    rawJson(r, 'Reservation JSON'),
  ];
}
