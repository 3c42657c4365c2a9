// Pools with their capacity, exactly the fields of capacity.get (what `capacity -o json` prints),
// the caller's quota on each, and each pool's GPUs over time (capacity.history).

import { utilisationChart } from './chart.js';
import { h, link, replace, value } from './dom.js';
import { href } from './route.js';

const GPU_USE = ['allocated', 'reserved', 'available'];
const GPU_OUT = ['provisioning', 'unhealthy', 'maintenance', 'unreachable'];
const HOST = ['total', 'allocatable', 'allocated', 'reserved', 'available'];
const NODES = ['total', 'adopting', 'adopted', 'connected', 'unreachable'];

/** Every pool's card; `charts` = {history(poolId), window(poolId), setWindow(poolId, w)}. */
export function renderPools(container, data, charts) {
  if (!data.pools.length) {
    replace(container, h('p', { class: 'empty' }, 'No pools visible to this token.'));
    return;
  }
  replace(container, data.pools.map((pool) => poolCard(pool, data, charts)));
}

/** One pool's card: the list's, and the page of the pool (#/pools/pool_…). */
export function poolCard(pool, data, charts) {
  const site = data.sites.find((s) => s.id === pool.siteId);
  const cap = data.capacity.get(pool.id);
  const title = pool.name || pool.key || pool.id;
  const headingId = `pool-${pool.id}`;
  return h('article', { class: 'card pool', dataset: { pool: pool.id }, 'aria-labelledby': headingId },
    h('h2', { id: headingId }, link(href('pools', pool.id), title)),
    h('p', { class: 'meta' },
      h('span', { class: 'id' }, pool.id), ' · ', pool.gpuModel, ' · site ',
      h('span', { class: 'site-name' }, site ? (site.name || site.key || site.id) : pool.siteId),
      site ? ` (${site.region}, ${site.kind})` : ''),
    cap ? capacity(cap) : h('p', { class: 'empty' }, 'No capacity read.'),
    cap?.quota ? quota(cap.quota, pool) : null,
    utilisationChart(pool.id, charts.history(pool.id), charts.window(pool.id), charts.setWindow));
}

/** The caller's quota on the pool (capacity.get's `quota`), and for the pool's owner the
 * tenants it is offered to with theirs (pools.list's `offerings`). */
function quota(q, pool) {
  const owner = q.gpu === 'unlimited';
  const offers = owner ? pool.offerings || [] : [];
  return h('div', { class: 'quota' },
    h('p', {}, 'Quota of ', h('strong', {}, q.tenantId), ': ',
      h('span', { dataset: { field: 'quota.gpu' } }, value(q.gpu)), owner ? ' (its own pool)' : ' GPUs',
      ', in use ', h('span', { dataset: { field: 'quota.inUse' } }, value(q.inUse))),
    offers.length ? h('p', { class: 'meta offers' }, 'offered to ', offers.map((o, i) => [i ? ', ' : '',
      h('span', { dataset: { offer: o.tenantId } }, `${o.tenantId} (gpu=${value(o.quota?.gpu)})`)]))
      : null);
}

function capacity(cap) {
  const gpu = cap.resources.gpu;
  return h('div', { class: 'capacity' },
    bar(gpu),
    h('dl', { class: 'counts' },
      count('gpu.total', 'GPUs', gpu.total),
      count('gpu.allocatable', 'allocatable', gpu.allocatable),
      GPU_USE.map((k) => count(`gpu.${k}`, k, gpu[k], k)),
      GPU_OUT.map((k) => count(`gpu.${k}`, k, gpu[k], gpu[k] ? 'warn' : ''))),
    hostTable(cap),
    h('p', { class: 'meta nodes-line' }, 'nodes: ',
      NODES.map((k, i) => [i ? ', ' : '', h('span', { dataset: { field: `nodes.${k}` } },
        value(cap.nodes[k])), ` ${k}`])));
}

/** A stacked bar over the pool's GPUs: allocated, reserved, available (widths only). */
function bar(gpu) {
  const label = `GPUs: ${gpu.allocated} allocated, ${gpu.reserved} reserved, ` +
    `${gpu.available} available, of ${gpu.allocatable} allocatable and ${gpu.total} in all`;
  const track = h('div', { class: 'bar', role: 'img', 'aria-label': label, title: label });
  for (const k of GPU_USE) {
    const seg = h('span', { class: `seg ${k}` });
    // CSSOM, not a style attribute: the Content-Security-Policy allows no inline style.
    seg.style.width = gpu.total ? `${Math.min(100, (100 * gpu[k]) / gpu.total)}%` : '0';
    track.appendChild(seg);
  }
  return track;
}

function count(field, label, n, kind = '') {
  return h('div', { class: `count ${kind}` },
    h('dt', {}, label), h('dd', { dataset: { field } }, value(n)));
}

function hostTable(cap) {
  // One column per resource, one row per field: narrow enough for a phone.
  const resources = ['cpu', 'memory'];
  const rows = HOST.map((k) => h('tr', {},
    h('th', { scope: 'row' }, k),
    resources.map((r) => h('td', { class: 'num', dataset: { field: `${r}.${k}` } },
      value(cap.resources[r][k])))));
  return h('div', { class: 'scroll', tabindex: '0', role: 'region', 'aria-label': 'Host CPUs and memory' },
    h('table', { class: 'host' },
      h('caption', { class: 'visually-hidden' }, 'Host CPUs and memory'),
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'host'),
        h('th', { scope: 'col', class: 'num' }, 'CPUs'),
        h('th', { scope: 'col', class: 'num' }, `memory (${cap.resources.memory.unit})`))),
      h('tbody', {}, rows)));
}
