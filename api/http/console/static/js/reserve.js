// The reserve form: capacity.preview answers first, as a summary (whether it fits, where, with
// which host share, the earliest start, the quota) with the whole answer one click away, so
// fields a newer server adds appear without a change here; then reservations.create with an
// idempotency key shown before it is used: a retry with the same key books nothing twice.

import { fields, h, link, newKey, rawJson, time, value, visible } from './dom.js';
import { href } from './route.js';

export class ReserveForm {
  constructor(container, app, refreshSoon) {
    this.app = app;
    this.refreshSoon = refreshSoon;
    this.key = newKey();
    this.pool = h('select', { id: 'reserve-pool', name: 'pool', required: true });
    this.gpus = h('input', { id: 'reserve-gpus', name: 'gpus', type: 'number', min: '1', max: '1024',
      step: '1', value: '1', required: true, inputmode: 'numeric' });
    this.duration = h('input', { id: 'reserve-duration', name: 'duration', type: 'text', value: '1h',
      required: true, autocomplete: 'off', spellcheck: 'false', 'aria-describedby': 'reserve-duration-hint' });
    this.start = h('input', { id: 'reserve-start', name: 'start', type: 'text', autocomplete: 'off',
      spellcheck: 'false', placeholder: 'now', 'aria-describedby': 'reserve-start-hint' });
    this.keyOut = h('output', { id: 'reserve-key', for: 'reserve-pool reserve-gpus reserve-duration reserve-start' }, this.key);
    this.answer = h('div', { id: 'reserve-answer', role: 'status', 'aria-live': 'polite' });
    this.error = h('p', { id: 'reserve-error', class: 'error', role: 'alert' });
    const preview = h('button', { type: 'button', id: 'reserve-preview', dataset: { action: 'preview' },
      onclick: () => this.preview() }, 'Preview');
    const submit = h('button', { type: 'submit', id: 'reserve-submit', dataset: { action: 'reserve' } }, 'Reserve');
    const form = h('form', { id: 'reserve-form', class: 'card reserve', novalidate: true,
      'aria-labelledby': 'reserve-title', onsubmit: (e) => { e.preventDefault(); this.reserve(); } },
    h('h2', { id: 'reserve-title' }, 'Reserve GPUs'),
    h('div', { class: 'grid-form' },
      field('reserve-pool', 'Pool', this.pool),
      field('reserve-gpus', 'GPUs', this.gpus),
      field('reserve-duration', 'Duration', this.duration,
        h('span', { id: 'reserve-duration-hint', class: 'hint' }, '30m, 2h, 1d')),
      field('reserve-start', 'Start', this.start,
        h('span', { id: 'reserve-start-hint', class: 'hint' }, 'empty for now, +2h, or an RFC 3339 time'))),
    h('p', { class: 'key' }, 'Idempotency key: ', this.keyOut),
    h('div', { class: 'row' }, preview, submit),
    this.error, this.answer);
    container.replaceChildren(form);
  }

  setPools(pools) {
    const chosen = this.pool.value;
    this.pool.replaceChildren(...pools.map((p) => h('option', { value: p.id },
      `${p.name || p.key || p.id} (${p.gpuModel}, ${p.id})`)));
    if (pools.some((p) => p.id === chosen)) this.pool.value = chosen;
  }

  params() {
    const params = { poolId: this.pool.value, gpus: Number(this.gpus.value),
      duration: this.duration.value.trim() };
    if (this.start.value.trim()) params.start = this.start.value.trim();
    return params;
  }

  async preview() {
    this.error.textContent = '';
    try {
      const answer = await this.app.api.call('capacity.preview', this.params());
      this.answer.replaceChildren(...previewSummary(answer));
    } catch (err) {
      this.fail(err);
    }
  }

  async reserve() {
    this.error.textContent = '';
    try {
      const rsv = await this.app.api.call('reservations.create', { ...this.params(), key: this.key });
      this.answer.replaceChildren(
        h('h3', {}, 'Reserved ', link(href('reservations', rsv.id),
          h('span', { class: 'id', id: 'reserve-created' }, rsv.id))),
        fields({ state: rsv.state, nodeId: rsv.nodeId, gpuCount: rsv.gpuCount, start: rsv.start,
          end: rsv.end, key: rsv.key }));
      this.key = newKey(); // the next reservation is a new one
      this.keyOut.textContent = visible(this.key);
      this.refreshSoon();
    } catch (err) {
      this.fail(err); // the same key again is safe: a retry returns what was booked, if anything
    }
  }

  fail(err) {
    this.error.textContent = visible(err.code ? `${err.code}: ${err.message}` : String(err));
  }
}

function field(id, label, control, hint = null) {
  return h('div', { class: 'stack' }, h('label', { for: id }, label), control, hint);
}

function gpuCount(n) {
  return `${n} GPU${n === 1 ? '' : 's'}`;
}

function host(resources) {
  return resources ? `${value(resources.cpus)} CPUs, ${value(resources.memoryGiB)} GiB of memory` : '—';
}

function nodeLink(id) {
  return id ? link(href('nodes', id), h('span', { class: 'id' }, id)) : '—';
}

function row(label, field, ...shown) {
  return h('div', {}, h('dt', {}, label), h('dd', { dataset: { field } }, ...shown));
}

/** capacity.preview's answer in a few lines a person reads (docs/api.md#capacitypreview), then
 * the answer itself, every field, one click away. */
export function previewSummary(answer) {
  const q = answer.quota || {};
  const earliest = answer.earliest;
  const rows = [
    row('Verdict', 'fits', answer.fits ? 'fits now' : `does not fit (${value(answer.reason)})`),
    row('Asked', 'asked', `${gpuCount(answer.gpus)} from `, time(answer.start), ' to ', time(answer.end)),
  ];
  if (answer.fits) {
    rows.push(row('On', 'nodeId', nodeLink(answer.nodeId)),
      row('Host share', 'hostResources', host(answer.hostResources)));
  } else {
    rows.push(row('Why', 'message', value(answer.message)));
    if (answer.quotaFreesAt) rows.push(row('Quota room at', 'quotaFreesAt', time(answer.quotaFreesAt)));
    rows.push(row('Earliest start', 'earliest', earliest
      ? [time(earliest.start), ' to ', time(earliest.end), ' on ', nodeLink(earliest.nodeId),
        ` (${host(earliest.hostResources)})`]
      : 'never: no schedulable node of the pool can hold it (a queued reservation waits for one)'));
  }
  rows.push(row('Quota', 'quota', q.gpu === 'unlimited' ? 'unlimited'
    : `${value(q.gpu)} GPUs, ${value(q.inUse)} in use`));
  return [h('h3', {}, answer.fits ? 'Preview: it fits' : 'Preview: it does not fit'),
    h('dl', { class: 'fields summary' }, rows), rawJson(answer)];
}
