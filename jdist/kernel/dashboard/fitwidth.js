// Invisible helper of jdist's notebook dashboard (jdist/kernel/dashboard/widget.py, class _FitWidth):
// resizes the plotly figures in its widget box to the box's width. plotly's FigureWidget under
// anywidget draws once at 700 px and never follows its container (plotly/plotly.py#5208); this
// calls plotly.js's resize when a figure in the same box renders and when the box is resized.
// `_responsiveChartHandler` is a plotly.js internal (set up by the `responsive` config); without it
// the helper does nothing.
export default {
  render({ el }) {
    el.style.display = 'none';
    const box = () => el.closest('.widget-box') || el.parentElement;
    const fit = p => p && p._responsiveChartHandler && p._responsiveChartHandler();
    const fitAll = () => {
      const b = box();
      if (b) {
        b.querySelectorAll('.js-plotly-plot').forEach(fit);
      }
    };
    const onRender = e => {
      const b = box();
      if (b && b.contains(e.detail.element)) {
        requestAnimationFrame(() => fit(e.detail.element));
      }
    };
    document.addEventListener('plotlywidget-after-render', onRender);
    let lastW = -1;
    const ro = new ResizeObserver(es => {
      const w = Math.round(es[0].contentRect.width);
      if (w !== lastW) {
        lastW = w;
        fitAll();
      }
    });
    requestAnimationFrame(() => {
      const b = box();
      if (b) {
        ro.observe(b);
      }
      fitAll();
    });
    return () => {
      document.removeEventListener('plotlywidget-after-render', onRender);
      ro.disconnect();
    };
  }
};
