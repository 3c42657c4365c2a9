// Where the page is: a view, and maybe one object of it, in the URL's fragment, so every view
// and every object has a link that opens it directly and survives a reload:
//
//   #/pools                         #/pools/pool_…
//   #/nodes?q=gpu-sn&state=cordoned #/nodes/node_…
//   #/reservations?state=live       #/reservations/rsv_…
//   #/events
//
// The list views keep their search, filter and sort in the query (so a filtered list is a link
// too). The fragment never reaches the server; the token is never in it.

export const VIEWS = ['pools', 'nodes', 'reservations', 'events'];
const PREFIXES = { pools: 'pool_', nodes: 'node_', reservations: 'rsv_' };
const ID_RE = /^[a-z]+_[a-z0-9]{1,64}$/;

/** {view, id, params} of a fragment such as '#/reservations/rsv_…' (older '#pools' too). */
export function parseRoute(hash) {
  const text = String(hash || '').replace(/^#\/?/, '');
  const [path, query = ''] = text.split('?', 2);
  const [view, id] = path.split('/');
  const params = Object.fromEntries(new URLSearchParams(query));
  if (!VIEWS.includes(view)) return { view: 'pools', id: null, params: {} };
  const object = id && PREFIXES[view] && id.startsWith(PREFIXES[view]) && ID_RE.test(id) ? id : null;
  return { view, id: object, params: object ? {} : params };
}

/** The fragment of a view, an object of it, or a list with its query. */
export function href(view, id = null, params = {}) {
  if (id) return `#/${view}/${id}`;
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== '' && v != null));
  const text = query.toString();
  return `#/${view}${text ? `?${text}` : ''}`;
}

/** The view whose objects have ids like `id` (rsv_… -> reservations), or null. */
export function viewOf(id) {
  const found = Object.entries(PREFIXES).find(([, prefix]) => String(id || '').startsWith(prefix));
  return found ? found[0] : null;
}
