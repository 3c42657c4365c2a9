// One short summary per event, the rule `better-compute events watch` prints by
// (cli/event_lines.py `summary` and `kind`), written again here because the page runs no
// Python: `4 GPUs on node_…` for reservation.placed, `key=value` of the data's plain fields
// for the rest, every hidden character escaped (dom.js `visible`, domain/visible.py) before
// it is cut to its width. tests/e2e/test_console_browser.py checks that both give the same
// text for the events of a real cluster, so a change to one alone fails.

import { visible } from './dom.js';

const SUMMARY_WIDTH = 72;
const GOOD = ['created', 'joined', 'connected', 'adopted', 'placed', 'active', 'healthy', 'offered',
  'uncordoned', 'passed', 'bound', 'renewed'];
const ENDED = ['released', 'cancelled', 'disconnected', 'cordoned', 'revoked', 'expired', 'ended',
  'unassigned', 'replaced'];
const BAD = ['failed', 'unhealthy', 'unreachable', 'rejected', 'timedout'];

/** 'good', 'ended', 'bad' or null: how an event of this type went, by its last word. */
export function kind(type) {
  const last = String(type).split('.').pop().replaceAll('_', '').replaceAll('-', '').toLowerCase();
  for (const [name, words] of [['bad', BAD], ['ended', ENDED], ['good', GOOD]]) {
    if (words.includes(last)) return name;
  }
  return null;
}

/** A value as Python's str() writes the JSON values the CLI prints. */
function py(v) {
  if (v === null || v === undefined) return 'None';
  if (v === true) return 'True';
  if (v === false) return 'False';
  return String(v);
}

function get(data, key, fallback) {
  return Object.hasOwn(data, key) ? data[key] : fallback;
}

function gpus(d) {
  const count = Array.isArray(d.gpus) ? d.gpus.length : d.gpuCount;
  return count === null || count === undefined ? '' : `${py(count)} GPU${count !== 1 ? 's' : ''}`;
}

function onNode(d) {
  return d.nodeId ? ` on ${py(d.nodeId)}` : '';
}

const SUMMARIES = {
  'reservation.placed': (d) => `${gpus(d)}${onNode(d)}`,
  'reservation.replaced': (d) => `${py(get(d, 'reason', ''))}: ${gpus(d)}${onNode(d)}`,
  'reservation.binding': (d) => `hold sent${onNode(d)}`,
  'reservation.active': (d) => `bound${onNode(d.binding || {})}`,
  'reservation.released': (d) => `${py(get(d, 'reason', 'released'))}${onNode(d)}`,
  'node.joined': (d) => `${gpus(d)}, pool ${py(get(d, 'poolId', ''))}`,
  'node.connected': (d) => `session epoch ${py(get(d, 'epoch', ''))}`,
  'node.adopted': (d) => `generation ${py(get(d, 'generation', ''))}`,
};

function scalars(data) {
  return Object.entries(data)
    .filter(([k, v]) => ['string', 'number', 'boolean'].includes(typeof v) && k !== 'at' && k !== 'by')
    .map(([k, v]) => `${k}=${py(v)}`).join(' ');
}

/** The summary of an event `{type, data, …}`, at most 72 characters. */
export function summary(event) {
  const data = event.data && typeof event.data === 'object' ? event.data : {};
  const special = SUMMARIES[String(event.type)];
  const text = visible(special ? special(data) : scalars(data));
  const chars = Array.from(text); // characters, as Python counts them
  return chars.length <= SUMMARY_WIDTH ? text : `${chars.slice(0, SUMMARY_WIDTH - 1).join('')}…`;
}
