// The live event feed: newest first, every event once (the Feed drops duplicates by sequence),
// filtered by type in the page, so changing the filter never reconnects nor loses a line. Each
// event as `events watch` prints it (sequence, type, subject, summary), its JSON one click away.

import { typeMatcher } from './api.js';
import { h, link, rawJson, time, visible } from './dom.js';
import { href, viewOf } from './route.js';
import { kind, summary } from './summary.js';

const KEEP = 1000; // events kept in the page; older ones drop off the end

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
    this.list.prepend(eventItem(event, this.matches));
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

/** One event as `events watch` prints it, its JSON (the whole line of the stream) one click
 * away; the subject links to its object's page when the console has one. */
export function eventItem(event, matches = () => true) {
  const subject = event.subject ?? '';
  const view = viewOf(subject);
  const item = h('li', { class: `event ${kind(event.type) || ''}`, dataset: { sequence: event.sequence,
    type: event.type, subject, tenant: event.tenantId ?? '' } },
  h('span', { class: 'seq' }, `#${event.sequence}`),
  h('span', { class: 'type' }, event.type),
  h('span', { class: 'subject id' }, view ? link(href(view, subject), subject) : subject),
  h('span', { class: 'tenant' }, event.tenantId ?? ''),
  time(event.time),
  h('span', { class: 'summary', dataset: { summary: '' } }, summary(event)),
  rawJson(event, 'JSON'));
  item.hidden = !matches(event.type);
  return item;
}
