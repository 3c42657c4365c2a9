// Nodes (nodes.list, then nodes.get for each node's newest report) and their GPUs as a grid,
// searched, filtered and sorted in the page (the view's query: #/nodes?q=…&state=…&sort=…).

import { confirmAction } from './dialog.js';
import { h, link, replace, time, value } from './dom.js';
import { href } from './route.js';

const HOLDING = new Set(['binding', 'active']); // states whose GPUs are held now

/** The filters of the nodes view: value -> [label, test(node, held GPUs)]. */
export const NODE_FILTERS = {
  '': ['every node', () => true],
  connected: ['connected', (n) => n.session?.state === 'connected'],
  'not-connected': ['not connected', (n) => n.session?.state !== 'connected'],
  adopting: ['not adopted yet', (n) => n.provisionState !== 'adopted'],
  cordoned: ['cordoned', (n) => Boolean(n.maintenance?.cordoned)],
  unhealthy: ['with an unhealthy GPU', (n) => unhealthyGpus(n) > 0 || condition(n, 'Healthy')?.status === 'False'],
  holding: ['holding GPUs', (n, held) => held > 0],
  free: ['with a free GPU', (n, held) => (n.gpus || []).length > held],
};

/** The orders of the nodes view: value -> [label, compare]. */
export const NODE_SORTS = {
  '': ['hostname', (a, b) => cmp(hostname(a.node), hostname(b.node))],
  pool: ['pool', (a, b) => cmp(a.node.poolId, b.node.poolId) || cmp(hostname(a.node), hostname(b.node))],
  held: ['GPUs held, most first', (a, b) => b.held - a.held || cmp(hostname(a.node), hostname(b.node))],
  free: ['GPUs free, most first', (a, b) => b.free - a.free || cmp(hostname(a.node), hostname(b.node))],
  report: ['last report, newest first', (a, b) => cmp(b.node.report?.at || '', a.node.report?.at || '')],
};

function cmp(a, b) {
  return String(a ?? '').localeCompare(String(b ?? ''), undefined, { numeric: true });
}

export function hostname(node) {
  return node.hardware?.hostname || node.hardwareKey || node.id;
}

function unhealthyGpus(node) {
  const telemetry = new Map((node.report?.gpus || []).map((g) => [g.uuid, g]));
  return (node.gpus || []).filter((g) => !(telemetry.get(g.uuid)?.healthy ?? g.healthy)).length;
}

/** GPU uuid -> the reservation holding it now (only reservations the token sees). */
export function holdersOf(reservations) {
  const holders = new Map();
  for (const r of reservations) {
    if (HOLDING.has(r.state)) for (const uuid of r.gpus || []) holders.set(uuid, r);
  }
  return holders;
}

/** The words a search matches on a node: hostname, ids, pool name, GPU names and holders. */
function haystack(node, pools, holders) {
  const pool = pools.get(node.poolId);
  return [hostname(node), node.id, node.poolId, pool?.name, pool?.key, node.hardwareKey,
    node.provisionState, node.session?.state, node.maintenance?.reason,
    ...(node.gpus || []).flatMap((g) => [g.uuid, g.product, g.name, holders.get(g.uuid)?.id])]
    .filter(Boolean).join(' ').toLowerCase();
}

/** The nodes `params` ({q, state, sort}) selects, in its order. */
export function selectNodes(data, params) {
  const holders = holdersOf(data.reservations);
  const pools = new Map(data.pools.map((p) => [p.id, p]));
  const words = String(params.q || '').toLowerCase().split(/\s+/).filter(Boolean);
  const [, test] = NODE_FILTERS[params.state] || NODE_FILTERS[''];
  const [, order] = NODE_SORTS[params.sort] || NODE_SORTS[''];
  return data.nodes
    .map((node) => {
      const held = (node.gpus || []).filter((g) => holders.has(g.uuid)).length;
      return { node, held, free: (node.gpus || []).length - held };
    })
    .filter(({ node, held }) => test(node, held))
    .filter(({ node }) => {
      const text = haystack(node, pools, holders);
      return words.every((w) => text.includes(w));
    })
    .sort(order)
    .map(({ node }) => node);
}

export function renderNodes(container, data, can, actions, params = {}) {
  if (!data.nodes.length) {
    replace(container, h('p', { class: 'empty' },
      'No nodes visible to this token (a tenant sees the nodes of its own tenant only).'));
    return 0;
  }
  const holders = holdersOf(data.reservations);
  const shown = selectNodes(data, params);
  replace(container, shown.length ? shown.map((node) => nodeCard(node, holders, can, actions))
    : h('p', { class: 'empty' }, 'No node matches the search and filter.'));
  return shown.length;
}

function condition(node, type) {
  return (node.conditions || []).find((c) => c.type === type);
}

/** One node's card: the list's, and the page of the node (#/nodes/node_…). */
export function nodeCard(node, holders, can, actions) {
  const headingId = `node-${node.id}`;
  const host = hostname(node);
  const session = node.session?.state || 'never connected';
  const cordoned = node.maintenance?.cordoned;
  const healthy = condition(node, 'Healthy');
  const inventory = condition(node, 'InventoryMatches');
  return h('article', { class: 'card node', dataset: { node: node.id }, 'aria-labelledby': headingId },
    h('h2', { id: headingId }, link(href('nodes', node.id), host)),
    h('p', { class: 'meta' }, h('span', { class: 'id' }, node.id), ' · pool ',
      link(href('pools', node.poolId), h('span', { class: 'id' }, node.poolId))),
    h('ul', { class: 'chips', 'aria-label': 'state' },
      h('li', { class: `chip ${node.provisionState}`, dataset: { field: 'provisionState' } },
        node.provisionState),
      h('li', { class: `chip ${session}`, dataset: { field: 'session' } }, session),
      healthy ? h('li', { class: `chip ${healthy.status === 'True' ? 'ok' : 'bad'}`, title: healthy.message },
        healthy.status === 'True' ? 'healthy' : healthy.reason) : null,
      cordoned ? h('li', { class: 'chip warn', dataset: { field: 'maintenance' } },
        `cordoned${node.maintenance.reason ? `: ${node.maintenance.reason}` : ''}`) : null,
      inventory && inventory.status === 'False'
        ? h('li', { class: 'chip bad', title: inventory.message, dataset: { field: 'inventory' } },
          'inventory mismatch') : null),
    inventory && inventory.status === 'False'
      ? h('p', { class: 'mismatch', dataset: { field: 'inventory-message' } }, inventory.message)
      : null,
    can.cordon(node) ? cordonButton(node, actions) : null,
    grid(node, holders),
    h('p', { class: 'meta' }, 'report ', time(node.report?.at)));
}

function grid(node, holders) {
  const telemetry = new Map((node.report?.gpus || []).map((g) => [g.uuid, g]));
  const gpus = node.gpus || [];
  if (!gpus.length) return h('p', { class: 'empty' }, 'No GPUs reported.');
  return h('ul', { class: 'gpus', 'aria-label': `GPUs of ${node.id}` }, gpus.map((gpu) => {
    const t = telemetry.get(gpu.uuid) || {};
    const healthy = t.healthy ?? gpu.healthy;
    const holder = holders.get(gpu.uuid);
    const reasons = t.healthReasons || gpu.healthReasons || [];
    return h('li', { class: `gpu ${healthy ? 'ok' : 'bad'} ${holder ? 'held' : ''}`,
      dataset: { gpu: gpu.uuid }, title: gpu.uuid },
    h('p', { class: 'gpu-name' }, `GPU ${gpu.index}`, h('span', { class: 'muted' }, ` ${gpu.family || ''}`)),
    h('p', { class: 'gpu-product' }, gpu.product || gpu.name),
    h('dl', { class: 'gpu-facts' },
      fact('health', 'health', healthy ? 'healthy' : `unhealthy${reasons.length ? ` (${reasons.join(', ')})` : ''}`),
      fact('temperature', 'temp.', t.temperatureC == null ? '—' : `${t.temperatureC} °C`),
      fact('utilisation', 'util.', t.utilizationPct == null ? '—' : `${t.utilizationPct} %`),
      fact('held by', 'held by', holder ? link(href('reservations', holder.id), holder.id) : 'free', 'wide')));
  }));
}

function fact(name, short, text, kind = '') {
  const label = short === name ? name : h('abbr', { title: name }, short);
  return h('div', { class: kind }, h('dt', {}, label),
    h('dd', { dataset: { field: name } }, text instanceof Node ? text : value(text)));
}

function cordonButton(node, actions) {
  const cordoned = node.maintenance?.cordoned;
  const verb = cordoned ? 'Uncordon' : 'Cordon';
  return h('button', {
    type: 'button', class: 'action', dataset: { action: verb.toLowerCase(), key: `${verb}:${node.id}` },
    'aria-label': `${verb} ${node.id}`,
    onclick: () => confirmAction({
      title: `${verb} ${node.id}`,
      text: cordoned
        ? 'End this node\'s maintenance: the placer considers it again.'
        : 'Put this node in maintenance: the placer skips it; holds on it stay.',
      ok: verb,
      fields: cordoned ? [] : [{ name: 'reason', label: 'Reason', value: '' }],
      run: (values) => actions.app.api.call(cordoned ? 'nodes.uncordon' : 'nodes.cordon',
        values.reason ? { nodeId: node.id, reason: values.reason } : { nodeId: node.id }),
      done: actions.refreshSoon,
    }),
  }, verb);
}
