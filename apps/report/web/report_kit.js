// The report page's drawing helpers that hold no state: DOM elements, number formatting, the
// run colours, series on one x axis, smoothing, and the uPlot plugins for spike markers and the
// zero line. html_report.cpp inlines this script before report.js, which takes them from
// `reportKit` (one global; every other name stays inside).
const reportKit = (function () {
  'use strict';
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v;
      else if (k === 'html') e.innerHTML = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  }
  function fmt(v, digits) {
    if (v == null || !isFinite(v)) return '–';
    if (v === 0) return '0';
    const a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) return v.toExponential((digits || 4) - 1).replace('e+', 'e');
    return String(Number(v.toPrecision(digits || 4)));
  }
  // Okabe-Ito, then Tol's muted: distinguishable for colour-blind readers.
  const PALETTE = ['#0072B2', '#D55E00', '#009E73', '#CC79A7', '#E69F00', '#56B4E9', '#000000', '#999933',
    '#882255', '#44AA99', '#AA4499', '#332288'];
  const color = (i) => PALETTE[i % PALETTE.length];
  function alpha(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return 'rgba(' + (n >> 16) + ',' + ((n >> 8) & 255) + ',' + (n & 255) + ',' + a + ')';
  }
  const layerName = (l) => (l < 0 ? 'embeddings' : 'L' + l);
  // Steps are whole numbers: ticks at 1, 2, 5 x 10^k.
  const STEP_INCRS = [];
  for (let m = 1; m <= 1e9; m *= 10) STEP_INCRS.push(m, 2 * m, 5 * m);

  // Series with their own x values -> uPlot's [xs, ys...] on the union of the x values.
  function align(list) {
    const xsSet = new Set();
    for (const s of list) for (const x of s.x) xsSet.add(x);
    const xs = Array.from(xsSet).sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const out = [xs];
    for (const s of list) {
      const y = new Array(xs.length).fill(null);
      for (let i = 0; i < s.x.length; ++i) y[at.get(s.x[i])] = s.y[i];
      out.push(y);
    }
    return out;
  }
  // Centred moving average over w points, ignoring gaps; the ends use shorter windows.
  function smooth(y, w) {
    if (w <= 1) return y;
    const h = Math.floor(w / 2), out = new Array(y.length);
    for (let i = 0; i < y.length; ++i) {
      let s = 0, n = 0;
      for (let k = Math.max(0, i - h); k <= Math.min(y.length - 1, i + h); ++k)
        if (y[k] != null && isFinite(y[k])) { s += y[k]; ++n; }
      out[i] = n ? s / n : null;
    }
    return out;
  }
  const positive = (y) => y.map((v) => (v != null && v > 0 ? v : null));

  // Vertical markers (spikes) drawn under the series: [{x, color, text}].
  function markerPlugin(marks) {
    return {
      hooks: {
        drawClear: (u) => {
          const ctx = u.ctx;
          ctx.save();
          ctx.lineWidth = 1.5 * devicePixelRatio;
          ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
          for (const m of marks) {
            const x = u.valToPos(m.x, 'x', true);
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
            ctx.strokeStyle = alpha(m.color, 0.7);
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
          }
          ctx.restore();
        },
      },
    };
  }
  function zeroLinePlugin() {
    return {
      hooks: {
        drawClear: (u) => {
          const y = u.valToPos(0, 'y', true);
          if (!(y >= u.bbox.top && y <= u.bbox.top + u.bbox.height)) return;
          const ctx = u.ctx;
          ctx.save();
          ctx.strokeStyle = '#9aa1ad';
          ctx.lineWidth = devicePixelRatio;
          ctx.beginPath();
          ctx.moveTo(u.bbox.left, y);
          ctx.lineTo(u.bbox.left + u.bbox.width, y);
          ctx.stroke();
          ctx.restore();
        },
      },
    };
  }

  return { el, fmt, PALETTE, color, alpha, layerName, STEP_INCRS, align, smooth, positive, markerPlugin, zeroLinePlugin };
})();
