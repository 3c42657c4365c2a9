// The live event feed: newest first, every event once (the Feed drops duplicates by sequence),
// filtered by type in the page, so changing the filter never reconnects nor loses a line.

import { typeMatcher } from './api.js';
import { h, time, visible } from './dom.js';

const KEEP = 1000; // events kept in the page; older ones drop off the end
const SHORT = 160; // characters of an event's data shown before it is opened

export class FeedView {
  constructor(list, statusLine, filterInput) {
    this.list = list;
    this.statusLine = statusLine;
    this.filterInput = filterInput;
    this.matches = typeMatcher(filterInput.value);
    this.onFilter = () => {
      this.matches = typeMatcher(filterInput.value);
      for (const item of this.list.children) item.hidden = !this.matches(item.dataset.type);
    };
    filterInput.addEventListener('input', this.onFilter);
    list.replaceChildren();
  }

  add(event) {
    const item = h('li', { class: 'event', dataset: { sequence: event.sequence, type: event.type,
      subject: event.subject ?? '', tenant: event.tenantId ?? '' } },
    h('span', { class: 'seq' }, `#${event.sequence}`),
    h('span', { class: 'type' }, event.type),
    h('span', { class: 'subject id' }, event.subject ?? ''),
    h('span', { class: 'tenant' }, event.tenantId ?? ''),
    time(event.time),
    data(event.data));
    item.hidden = !this.matches(event.type);
    this.list.prepend(item);
    while (this.list.children.length > KEEP) this.list.lastElementChild.remove();
  }

  dispose() {
    this.filterInput.removeEventListener('input', this.onFilter);
  }

  status(state, detail) {
    this.statusLine.textContent = visible(`${state}: ${detail}`);
    this.statusLine.dataset.state = state;
  }
}

/** The event's data as JSON text: long data folded behind its first line. */
function data(value) {
  const text = JSON.stringify(value ?? {});
  if (text.length <= SHORT) return h('code', { class: 'data' }, text);
  return h('details', {}, h('summary', {}, h('code', {}, `${text.slice(0, SHORT)}…`)),
    h('code', { class: 'data' }, text));
}
