// Pools with their capacity, exactly the fields of capacity.get (what `capacity -o json` prints).

import { h, replace, value } from './dom.js';

const GPU_USE = ['allocated', 'reserved', 'available'];
const GPU_OUT = ['provisioning', 'unhealthy', 'maintenance', 'unreachable'];
const HOST = ['total', 'allocatable', 'allocated', 'reserved', 'available'];
const NODES = ['total', 'adopting', 'adopted', 'connected', 'unreachable'];

export function renderPools(container, data) {
  if (!data.pools.length) {
    replace(container, h('p', { class: 'empty' }, 'No pools visible to this token.'));
    return;
  }
  const sites = new Map(data.sites.map((s) => [s.id, s]));
  replace(container, data.pools.map((pool) => card(pool, sites.get(pool.siteId),
    data.capacity.get(pool.id))));
}

function card(pool, site, cap) {
  const title = pool.name || pool.key || pool.id;
  const headingId = `pool-${pool.id}`;
  return h('article', { class: 'card pool', dataset: { pool: pool.id }, 'aria-labelledby': headingId },
    h('h2', { id: headingId }, title),
    h('p', { class: 'meta' },
      h('span', { class: 'id' }, pool.id), ' · ', pool.gpuModel, ' · site ',
      h('span', { class: 'site-name' }, site ? (site.name || site.key || site.id) : pool.siteId),
      site ? ` (${site.region}, ${site.kind})` : ''),
    cap ? capacity(cap) : h('p', { class: 'empty' }, 'No capacity read.'));
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
