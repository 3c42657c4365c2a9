// Nodes (nodes.list, then nodes.get for each node's newest report) and their GPUs as a grid.

import { confirmAction } from './dialog.js';
import { h, replace, time, value } from './dom.js';

const HOLDING = new Set(['binding', 'active']); // states whose GPUs are held now

export function renderNodes(container, data, can, actions) {
  if (!data.nodes.length) {
    replace(container, h('p', { class: 'empty' },
      'No nodes visible to this token (a tenant sees the nodes of its own tenant only).'));
    return;
  }
  const holders = new Map(); // GPU uuid -> the reservation holding it now
  for (const r of data.reservations) {
    if (HOLDING.has(r.state)) for (const uuid of r.gpus || []) holders.set(uuid, r);
  }
  replace(container, data.nodes.map((node) => card(node, holders, can, actions)));
}

function condition(node, type) {
  return (node.conditions || []).find((c) => c.type === type);
}

function card(node, holders, can, actions) {
  const headingId = `node-${node.id}`;
  const host = node.hardware?.hostname || node.hardwareKey || node.id;
  const session = node.session?.state || 'never connected';
  const cordoned = node.maintenance?.cordoned;
  const healthy = condition(node, 'Healthy');
  const inventory = condition(node, 'InventoryMatches');
  return h('article', { class: 'card node', dataset: { node: node.id }, 'aria-labelledby': headingId },
    h('h2', { id: headingId }, host),
    h('p', { class: 'meta' }, h('span', { class: 'id' }, node.id), ' · pool ',
      h('span', { class: 'id' }, node.poolId)),
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
      fact('held by', 'held by', holder ? holder.id : 'free', 'wide')));
  }));
}

function fact(name, short, text, kind = '') {
  const label = short === name ? name : h('abbr', { title: name }, short);
  return h('div', { class: kind }, h('dt', {}, label), h('dd', { dataset: { field: name } }, value(text)));
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
