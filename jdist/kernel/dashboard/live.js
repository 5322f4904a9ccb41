// The ES module of each live dashboard widget (jdist/kernel/dashboard/widget.py, class LiveDashboard).
// Kept small: it is sent with every dashboard. It keeps the kernel's messages (new points) as they
// arrive, waits for the chart library that the hidden ChartsLib widget loads once per page
// (labextension/src/notebook.ts, built into charts.js) and lets it draw.
const stores = (globalThis.__jdist_dashboard_stores ??= new Map());

function storeOf(model) {
  const uid = model.get('uid');
  let store = stores.get(uid);
  if (!store) {
    store = { queue: [], views: new Set() };
    stores.set(uid, store);
  }
  return store;
}

function library(key, timeoutMs) {
  return new Promise(resolve => {
    const t0 = performance.now();
    const look = () => {
      const lib = globalThis.__jdist_dashboard?.[key];
      if (lib || performance.now() - t0 > timeoutMs) {
        resolve(lib ?? null);
      } else {
        setTimeout(look, 20);
      }
    };
    look();
  });
}

export default {
  initialize({ model }) {
    const store = storeOf(model);
    const onMessage = (msg, buffers) => {
      store.queue.push([msg, buffers]);
      store.views.forEach(redraw => redraw());
    };
    model.on('msg:custom', onMessage);
    return () => {
      model.off('msg:custom', onMessage);
      stores.delete(model.get('uid'));
    };
  },
  async render({ model, el }) {
    const lib = await library(model.get('lib'), 15000);
    if (!lib) {
      el.textContent = 'jdist: the live dashboard could not load its chart code in this page; ' +
        'the summary replaces it when the cell ends.';
      return;
    }
    return lib.render({ model, el, store: storeOf(model) });
  }
};
