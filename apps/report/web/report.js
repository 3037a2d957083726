// The stability report's page: draws the JSON document in <script id="report-data"> with
// uPlot and the stateless helpers of report_kit.js (both inlined before this script). Written by apps/report/html_report.cpp; its keys:
//   version, generated, refresh_s (> 0: reload every refresh_s s, keeping the settings),
//   reference (index into runs), distance_notes[],
//   runs[]: name, dir, shape, config{key: text}, notes[], checkpoints,
//     files{spectral|attn|drift|grad|events|wasserstein: {present, note}},
//     train{step[], loss[], grad_norm[], lr[], loss_scale[]?, thinned}, val{step[], loss[]},
//     dloss{step[], y[]}, dval{step[], y[]} (run minus reference at the steps both logged;
//     not on the reference), events[]{step, event, metric, value, loss, action, text},
//     spectral[]{m, l, h, x[], y[]}, attn[]{s, l, h, x[], y[]}, drift[]{f, l, h, x[], y[]},
//     grad[]{l, x[], y[]} (layer -1: embeddings and final layernorm);
//   distance[]: run, against (index or null), source, pairing, notes[], pairs[]{a, b},
//     series[]{t, l, h, x[], w1n[], max[]}.
// null in an array is a missing / non-finite value (drawn as a gap). Every panel's element
// carries data-panel and data-series (its number of drawn series), and <body> data-rendered,
// data-panels, data-errors, data-render-ms (this script's time) and data-ready-ms (from
// the navigation's start to the page drawn), for the render test (tests/test_report.cpp)
// and bench/report_load.sh.
(function () {
  'use strict';
  const t0 = performance.now();
  const errors = [];
  const app = document.getElementById('app');
  function showError(msg) {
    errors.push(msg);
    document.body.dataset.errors = String(errors.length);
    const p = document.createElement('p');
    p.className = 'error';
    p.textContent = 'report page error: ' + msg;
    app.prepend(p);
  }
  window.addEventListener('error', (e) => showError(String(e.message)));

  // ------------------------------------------------------------------ helpers (report_kit.js)
  const { el, fmt, color, alpha, layerName, STEP_INCRS, align, smooth, positive, markerPlugin, zeroLinePlugin } = reportKit;

  // ------------------------------------------------------------------ state
  const D = JSON.parse(document.getElementById('report-data').textContent);
  const R = D.runs, REF = D.reference;
  const storeKey = 'stabletrain-report:' + location.pathname;
  let saved = {};
  try { saved = JSON.parse(sessionStorage.getItem(storeKey) || '{}'); } catch (e) { saved = {}; }
  const state = {
    hidden: new Set(saved.hidden || []),
    smooth: saved.smooth || 1,
    sel: saved.sel || {},
    zoom: saved.zoom || null,
  };
  // A view in the address, for links and screenshots: report.html?only=spectral,drift&spectral=wk
  // &attn=tied_row_frac&drift=delta_drift starts each named select (spectral, attn, drift,
  // dist_metric, dist_tensor) at the given value, before the kept settings, and `only` shows
  // just the named sections (loss, grad, spectral, attention, drift, distance) below the runs
  // table. A value the page does not offer is ignored (the select keeps its default).
  const view = new URLSearchParams(location.search);
  for (const [k, v] of view) if (k !== 'only') state.sel[k] = v;
  function saveState() {
    try {
      sessionStorage.setItem(storeKey, JSON.stringify({
        hidden: Array.from(state.hidden), smooth: state.smooth, sel: state.sel, zoom: state.zoom, scroll: window.scrollY,
      }));
    } catch (e) { /* storage refused (file:// in some browsers): settings are not kept */ }
  }

  // Every chart: {u, runOf: [series index -> run index], group}
  const charts = [];
  let syncing = false;
  function applyZoom(min, max, from) {
    syncing = true;
    for (const c of charts) if (c.u !== from) c.u.setScale('x', { min, max });
    syncing = false;
  }
  function resetZoom() {
    state.zoom = null;
    syncing = true;
    for (const c of charts) {
      const xs = c.u.data[0];
      if (xs.length) c.u.setScale('x', { min: xs[0], max: xs[xs.length - 1] });
    }
    syncing = false;
  }

  // A panel: title, subtitle, a uPlot chart. spec: {id, title, sub, width, height, series:
  // [{label, run, color, width, dash, points, data}], xs, ylog, yrange, legend, marks, zero,
  // readout (a function (u, idx) -> text, for panels without a legend), group}.
  function panel(container, spec) {
    const wrap = el('div', { class: 'panel', 'data-panel': spec.id, 'data-series': String(spec.series.length) },
      el('div', { class: 'ptitle' }, spec.title), spec.sub ? el('div', { class: 'psub' }, spec.sub) : null);
    container.append(wrap);
    const series = [{ label: 'step', value: (u, v) => (v == null ? '–' : String(v)) }];
    for (const s of spec.series) {
      const o = {
        label: s.label,
        stroke: s.color,
        width: s.width || 1.5,
        dash: s.dash,
        spanGaps: true,
        show: !state.hidden.has(s.run),
        points: s.points ? { show: true, size: 6, fill: s.color } : { show: false },
        value: (u, v) => fmt(v, 5),
      };
      if (s.pointsOnly) o.paths = () => null;
      series.push(o);
    }
    const plugins = [];
    if (spec.marks && spec.marks.length) plugins.push(markerPlugin(spec.marks));
    if (spec.zero) plugins.push(zeroLinePlugin());
    const yscale = spec.ylog ? { distr: 3, log: 10 } : {};
    if (spec.yrange) yscale.range = () => spec.yrange;
    const opts = {
      width: spec.width,
      height: spec.height,
      plugins,
      scales: { x: { time: false }, y: yscale },
      series,
      legend: { show: !!spec.legend, live: true },
      cursor: { sync: { key: 'st', setSeries: false }, focus: { prox: 16 }, drag: { x: true, y: false } },
      focus: { alpha: 0.35 },
      axes: [
        { label: spec.xlabel || 'step', size: 36, labelSize: 16, font: '11px system-ui', labelFont: '11px system-ui',
          incrs: STEP_INCRS },
        { size: 56, font: '11px system-ui', values: (u, vals) => vals.map((v) => (v == null ? '' : fmt(v, 3))) },
      ],
      hooks: {
        setScale: [(u, key) => {
          if (key !== 'x' || syncing) return;
          const { min, max } = u.scales.x;
          const xs = u.data[0];
          const full = xs.length && min <= xs[0] && max >= xs[xs.length - 1];
          state.zoom = full ? null : [min, max];
          applyZoom(min, max, u);
        }],
        setCursor: spec.readout ? [(u) => spec.readout(u, u.cursor.idx)] : [],
      },
    };
    const data = [spec.xs];
    for (const s of spec.series) data.push(spec.ylog ? positive(s.data) : s.data);
    const u = new uPlot(opts, data, wrap);
    const c = { u, spec, runOf: spec.series.map((s) => s.run) };
    charts.push(c);
    if (state.zoom) u.setScale('x', { min: state.zoom[0], max: state.zoom[1] });
    return c;
  }

  function setRunShown(run, show) {
    if (show) state.hidden.delete(run); else state.hidden.add(run);
    for (const c of charts)
      c.runOf.forEach((r, i) => { if (r === run) c.u.setSeries(i + 1, { show }); });
    saveState();
  }

  function section(id, title, caption) {
    const s = el('section', { id });
    s.append(el('h2', {}, title));
    if (caption) s.append(el('p', { class: 'caption', html: caption }));
    app.append(s);
    return s;
  }
  function note(parent, text) { parent.append(el('p', { class: 'note' }, text)); }
  // One line per distinct note, naming the runs it holds for: "runs a, b: no spectral.csv: ...".
  function runNotes(parent, pairs) {
    const by = new Map();
    for (const [run, text] of pairs) if (text) { if (!by.has(text)) by.set(text, []); by.get(text).push(R[run].name); }
    for (const [text, names] of by) note(parent, names.join(', ') + ': ' + text);
  }
  function select(parent, key, label, options, onchange) {
    const cur = state.sel[key] && options.some((o) => o[0] === state.sel[key]) ? state.sel[key] : options[0][0];
    state.sel[key] = cur;
    const s = el('select', { 'data-control': key });
    for (const [v, t] of options) {
      const o = el('option', { value: v }, t);
      if (v === cur) o.selected = true;
      s.append(o);
    }
    s.addEventListener('change', () => { state.sel[key] = s.value; saveState(); onchange(s.value); });
    parent.append(el('label', {}, label + ' ', s));
    return cur;
  }
  function destroyIn(container) {
    for (let i = charts.length - 1; i >= 0; --i)
      if (container.contains(charts[i].u.root)) { charts[i].u.destroy(); charts.splice(i, 1); }
    container.textContent = '';
  }

  // Small multiples: one panel per layer, every run's series (per head or one) in its run's
  // colour, one y range shared by every panel. rows: [{run, l, h, x, y}] (h -1: one series).
  const SM_W = 290, SM_H = 190;
  function smallMultiples(container, id, rows, opts) {
    const layers = Array.from(new Set(rows.map((r) => r.l))).sort((a, b) => a - b);
    let lo = Infinity, hi = -Infinity;
    for (const r of rows)
      for (const v of r.y)
        if (v != null && isFinite(v) && (!opts.ylog || v > 0)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    let yrange = null;
    if (lo <= hi) {
      if (opts.ylog) yrange = [lo / 1.15, hi * 1.15];
      else {
        if (opts.zero) { lo = Math.min(lo, 0); hi = Math.max(hi, 0); }
        const pad = hi > lo ? 0.05 * (hi - lo) : Math.max(Math.abs(hi) * 0.1, 1e-12);
        yrange = [lo - pad, hi + pad];
      }
    }
    const readout = el('div', { class: 'readout' }, 'hover a panel: values of every run at that step');
    const grid = el('div', { class: 'grid' });
    container.append(readout, grid);
    for (const l of layers) {
      const mine = rows.filter((r) => r.l === l).sort((a, b) => a.run - b.run || a.h - b.h);
      const aligned = align(mine);
      const series = mine.map((r, i) => ({
        label: R[r.run].name + (r.h >= 0 ? ' H' + r.h : r.tag ? ' ' + r.tag : ''),
        run: r.run,
        color: r.h >= 0 ? alpha(color(r.run), 0.75) : color(r.run),
        width: r.h >= 0 ? 1.1 : 1.8,
        dash: r.dash,
        points: opts.points,
        data: aligned[i + 1],
      }));
      panel(grid, {
        id: id + ':' + layerName(l), title: (opts.layerTitle || layerName)(l), sub: opts.sub, width: SM_W, height: SM_H,
        series, xs: aligned[0], ylog: opts.ylog, yrange, zero: opts.zero, points: opts.points,
        readout: (u, idx) => {
          if (idx == null) return;
          const step = u.data[0][idx];
          const parts = [];
          for (let run = 0; run < R.length; ++run) {
            if (state.hidden.has(run)) continue;
            const vals = [];
            mine.forEach((r, i) => { if (r.run === run && u.data[i + 1][idx] != null) vals.push([r, u.data[i + 1][idx]]); });
            if (!vals.length) continue;
            if (vals.length === 1) { parts.push(R[run].name + ' ' + fmt(vals[0][1], 5)); continue; }
            vals.sort((a, b) => b[1] - a[1]);
            const mean = vals.reduce((s, v) => s + v[1], 0) / vals.length;
            parts.push(R[run].name + ': max H' + vals[0][0].h + ' ' + fmt(vals[0][1], 4) + ', min H' +
              vals[vals.length - 1][0].h + ' ' + fmt(vals[vals.length - 1][1], 4) + ', mean ' + fmt(mean, 4));
          }
          readout.textContent = layerName(l) + ' · step ' + step + ' · ' + (parts.join(' | ') || 'no value');
        },
      });
    }
  }

  // ------------------------------------------------------------------ header
  const ref = R[REF];
  app.append(el('p', { class: 'sub' }, R.length + ' run' + (R.length === 1 ? '' : 's') + ' · reference: ' + ref.name +
    (D.generated ? ' · ' + D.generated : '') +
    (D.refresh_s > 0 ? ' · reloads every ' + D.refresh_s + ' s (report --watch)' : '') + ' · stabletrain report'));
  {
    const keys = [['precision.compute', 'precision'], ['attention.backend', 'attention'], ['run.seed', 'seed']];
    const head = el('tr', {}, el('th', {}, 'show'), el('th', {}, 'run'));
    for (const [, t] of keys) head.append(el('th', {}, t));
    for (const t of ['model', 'steps', 'last loss', 'last val loss', 'hooks', 'files']) head.append(el('th', {}, t));
    const body = el('tbody');
    R.forEach((r, i) => {
      const box = el('input', { type: 'checkbox', 'data-run': String(i) });
      box.checked = !state.hidden.has(i);
      box.addEventListener('change', () => setRunShown(i, box.checked));
      const tr = el('tr', {}, el('td', {}, box),
        el('td', {}, el('span', { class: 'swatch', style: 'background:' + color(i) }), r.name,
          i === REF ? el('span', { class: 'badge ref' }, 'reference') : null, el('div', { class: 'path' }, r.dir)));
      // The attention cell: the backend, per-layer backends, and a narrowed O~ (o_tilde_bits).
      const shown = (x, k) => {
        let v = x.config[k] || '–';
        if (k !== 'attention.backend') return v;
        if (x.config['attention.layer_backends']) v += ' (' + x.config['attention.layer_backends'] + ')';
        const bits = x.config['attention.o_tilde_bits'];
        if (bits && bits !== '0') v += ' · Õ ' + bits + ' bits';
        return v;
      };
      for (const [k] of keys)
        tr.append(el('td', { class: i !== REF && shown(r, k) !== shown(ref, k) ? 'diff' : '' }, shown(r, k)));
      const st = r.train.step;
      let steps = st.length ? st[0] + '–' + st[st.length - 1] : '–';
      if (st.length && r.config['train.max_steps'] && String(st[st.length - 1]) !== r.config['train.max_steps'])
        steps += ' of ' + r.config['train.max_steps'];
      const lastOf = (a) => { for (let k = a.length - 1; k >= 0; --k) if (a[k] != null) return a[k]; return null; };
      const every = r.config['hooks.every'];
      const files = el('td');
      for (const [k, f] of Object.entries(r.files)) files.append(el('span', { class: 'badge' + (f.present ? '' : ' off'), title: f.note || '' }, k));
      files.append(el('span', { class: 'badge' + (r.checkpoints ? '' : ' off') }, r.checkpoints + ' ckpt'));
      tr.append(el('td', {}, r.shape || '–'), el('td', { class: 'n' }, steps), el('td', { class: 'n' }, fmt(lastOf(r.train.loss), 5)),
        el('td', { class: 'n' }, fmt(lastOf(r.val.loss), 5)),
        el('td', {}, every == null ? '–' : every === '0' ? 'off' : 'every ' + every), files);
      body.append(tr);
    });
    app.append(el('table', { class: 'runs' }, el('thead', {}, head), body));
    R.forEach((r) => r.notes.forEach((n) => note(app, r.name + ': ' + n)));
  }
  const controls = el('div', { class: 'controls sticky' });
  app.append(controls);
  controls.append(el('nav', {}, el('a', { href: '#loss' }, 'Loss'), el('a', { href: '#grad' }, 'Grad norms'),
    el('a', { href: '#spectral' }, 'Spectral norms'), el('a', { href: '#attention' }, 'Attention'),
    el('a', { href: '#drift' }, 'δ drift'), el('a', { href: '#distance' }, 'Weight distance')));
  controls.append(el('span', {}, 'drag: zoom · double-click: reset · click a legend entry or a run\'s box: hide it'));
  controls.append(el('button', { onclick: resetZoom }, 'reset zoom'));

  // ------------------------------------------------------------------ 1. loss
  {
    const s = section('loss', 'Loss',
      'Training loss of every run per step (raw; the smoothing control averages over a centred window of logged ' +
      'steps), validation loss as dots, and the difference to the reference run <b>' + ref.name.replace(/</g, '&lt;') +
      '</b> at the steps both logged (run − reference). Dashed vertical lines: spikes and other events from ' +
      '<code>events.jsonl</code> (listed below). Hover: every run\'s value at that step in the legend.');
    const ctl = el('div', { class: 'controls' });
    s.append(ctl);
    const sm = el('select', { 'data-control': 'smooth' });
    for (const w of [1, 5, 11, 25, 51, 101]) {
      const o = el('option', { value: String(w) }, w === 1 ? 'off (raw)' : w + ' steps');
      if (w === state.smooth) o.selected = true;
      sm.append(o);
    }
    ctl.append(el('label', {}, 'smoothing ', sm));
    const thinned = R.filter((r) => r.train.thinned);
    if (thinned.length)
      note(s, 'long runs drawn from ' + thinned.map((r) => r.name + ' (' + r.train.thinned + ' steps)').join(', ') +
        ': per bucket of consecutive steps the first, smallest and largest loss are kept, so spikes stay visible');
    const grid = el('div', { class: 'grid' });
    s.append(grid);
    const marks = [];
    R.forEach((r, i) => r.events.forEach((e) => marks.push({ x: e.step, color: color(i), text: e.text })));
    const smoothable = [];
    function runPanel(id, title, sub, pick, o) {
      const list = [], meta = [];
      R.forEach((r, i) => {
        const p = pick(r, i);
        if (!p) return;
        list.push(p);
        meta.push({ run: i, label: r.name + (p.suffix || ''), points: p.points, pointsOnly: p.pointsOnly });
      });
      if (!list.length) return null;
      const al = align(list);
      const series = meta.map((m, k) => ({ label: m.label, run: m.run, color: color(m.run), width: 1.4,
        points: m.points, pointsOnly: m.pointsOnly, data: al[k + 1] }));
      const c = panel(grid, Object.assign({ id, title, sub, width: 590, height: 260, series, xs: al[0], legend: true,
        marks }, o));
      if (o && o.smoothable) smoothable.push({ c, raw: series.map((x) => x.data), ylog: o.ylog });
      return c;
    }
    // Loss: one series per run, and one per run with validation losses (dots).
    {
      const list = [], meta = [];
      R.forEach((r, i) => { list.push({ x: r.train.step, y: r.train.loss }); meta.push({ run: i, label: r.name, kind: 'train' }); });
      R.forEach((r, i) => { if (r.val.step.length) { list.push({ x: r.val.step, y: r.val.loss }); meta.push({ run: i, label: r.name + ' val', kind: 'val' }); } });
      const al = align(list);
      const series = meta.map((m, k) => ({ label: m.label, run: m.run, color: m.kind === 'val' ? alpha(color(m.run), 0.9) : color(m.run),
        width: 1.4, points: m.kind === 'val', pointsOnly: m.kind === 'val', data: al[k + 1] }));
      const lc = panel(grid, { id: 'loss', title: 'Loss', sub: 'nats per token: training (lines), validation (dots)', width: 1190,
        height: 330, series, xs: al[0], legend: true, marks });
      smoothable.push({ c: lc, raw: series.map((x) => x.data), kinds: meta.map((m) => m.kind) });
    }
    runPanel('dloss', 'Δ training loss vs ' + ref.name, 'run − reference, same step', (r) => (r.dloss ? { x: r.dloss.step, y: r.dloss.y } : null),
      { smoothable: true, zero: true });
    runPanel('dval', 'Δ validation loss vs ' + ref.name, 'run − reference, same step',
      (r) => (r.dval && r.dval.step.length ? { x: r.dval.step, y: r.dval.y, points: true } : null), { zero: true });
    runPanel('grad_norm', 'Gradient norm', 'global, before clipping (log)', (r) => ({ x: r.train.step, y: r.train.grad_norm }),
      { smoothable: true, ylog: true });
    const anyScale = R.some((r) => r.train.loss_scale);
    runPanel('lr', anyScale ? 'Loss scale' : 'Learning rate', anyScale ? 'fp16 dynamic loss scaling (log)' : '',
      (r) => ({ x: r.train.step, y: anyScale ? (r.train.loss_scale || []) : r.train.lr }), { ylog: anyScale });
    if (R.length < 2) note(s, 'one run given: no Δloss panels (pass two or more runs)');
    function applySmoothing(w) {
      state.smooth = w;
      for (const sp of smoothable) {
        const u = sp.c.u;
        const data = [u.data[0]].concat(sp.raw.map((y, k) => (sp.kinds && sp.kinds[k] === 'val' ? y : smooth(y, w))));
        u.setData(sp.ylog ? data.map((y, k) => (k ? positive(y) : y)) : data, false);
        u.redraw();
      }
    }
    sm.addEventListener('change', () => { applySmoothing(Number(sm.value)); saveState(); });
    if (state.smooth > 1) applySmoothing(state.smooth);
    // Events.
    const eventNotes = [];
    R.forEach((r, i) => {
      if (r.files.events.note) eventNotes.push([i, r.files.events.note]);
      if (!r.files.events.present) return;
      if (!r.events.length) { eventNotes.push([i, 'events.jsonl holds no events']); return; }
      s.append(el('h3', {}, el('span', { class: 'swatch', style: 'background:' + color(i) }), r.name + ': ' + r.events.length +
        ' event' + (r.events.length === 1 ? '' : 's') + ' (events.jsonl)'));
      const tb = el('tbody');
      for (const e of r.events.slice(0, 25)) tb.append(el('tr', {}, el('td', { class: 'n' }, e.step), el('td', {}, e.text)));
      s.append(el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'step'), el('th', {}, 'event'))), tb));
      if (r.events.length > 25) note(s, 'first 25 of ' + r.events.length);
    });
    runNotes(s, eventNotes);
  }

  // ------------------------------------------------------------------ 2. grad norms per layer
  {
    const s = section('grad', 'Gradient norms per layer',
      'L2 norm of each layer\'s gradient on the hook steps (<code>grad_norms.csv</code>: the step\'s accumulated ' +
      'gradient, unscaled, before clipping; per layer the norm over its tensors, per-head slices not counted twice; ' +
      '<i>embeddings</i>: <code>wte wpe lnfw lnfb</code>). One panel per layer, runs as colours, one log scale.');
    const rows = [];
    runNotes(s, R.map((r, i) => [i, r.files.grad.note]));
    R.forEach((r, i) => { for (const g of r.grad) rows.push({ run: i, l: g.l, h: -1, x: g.x, y: g.y }); });
    if (rows.length) smallMultiples(s, 'grad', rows, { ylog: true, points: true });
  }

  // ------------------------------------------------------------------ 3. spectral norms
  // A select of one value of `field` (spectral: m, attn: s, drift: f) in the runs' `key`
  // rows (spectral, attn, drift: also the file's note and the select's key), and its panels.
  // Options: the values of `known` (value -> text) found, in its order, then any other value
  // found as is; `group` maps a value onto the option that draws it (wpe is drawn with wte).
  function bySelection(s, key, field, label, known, rowOf, opts, group) {
    const as = group || ((v) => v);
    runNotes(s, R.map((r, i) => [i, r.files[key].note]));
    const found = new Set();
    R.forEach((r) => r[key].forEach((x) => found.add(as(x[field]))));
    const isKnown = (v) => Object.prototype.hasOwnProperty.call(known, v);
    const options = Object.keys(known).filter((v) => found.has(v)).map((v) => [v, known[v]]);
    for (const v of found) if (!isKnown(v)) options.push([v, v]);
    if (!options.length) return;
    const ctl = el('div', { class: 'controls' });
    const body = el('div');
    s.append(ctl, body);
    const draw = (v) => {
      destroyIn(body);
      const rows = [];
      R.forEach((r, i) => r[key].forEach((x) => { if (as(x[field]) === v) rows.push(rowOf(x, i)); }));
      if (!rows.length) { note(body, 'no data for ' + v); return; }
      smallMultiples(body, s.id + ':' + v, rows, typeof opts === 'function' ? opts(v) : opts);
    };
    draw(select(ctl, key, label, options, draw));
  }
  const headRow = (x, i) => ({ run: i, l: x.l, h: x.h, x: x.x, y: x.y });
  {
    const s = section('spectral', 'Spectral norms',
      'Largest singular value σ of each weight slice on the hook steps (<code>spectral.csv</code>, FP32 master ' +
      'weights after the step\'s update). Per-head matrices: a line per head in its run\'s colour; per-layer ' +
      'matrices: a line per run. One panel per layer, one log scale shared by all panels and runs; the readout ' +
      'gives each run\'s largest and smallest head at the hovered step.');
    const TEXT = { wq: 'W_Q per head', wk: 'W_K per head', wv: 'W_V per head', wo: 'W_O per head', qkvw: 'qkvw (fused QKV)',
      attprojw: 'attprojw', fcw: 'fcw (MLP in)', fcprojw: 'fcprojw (MLP out)', wte: 'wte, wpe (embeddings)' };
    bySelection(s, 'spectral', 'm', 'matrix', TEXT,
      (x, i) => ({ run: i, l: x.l, h: x.h, x: x.x, y: x.y, tag: x.l < 0 ? x.m : '', dash: x.m === 'wpe' ? [5, 3] : undefined }),
      { ylog: true, points: true }, (m) => (m === 'wpe' ? 'wte' : m));
  }

  // ------------------------------------------------------------------ 4. attention statistics
  {
    const s = section('attention', 'Attention statistics',
      'Per head on the hook steps (<code>attn_stats.csv</code>, the hook step\'s last micro-batch): the largest ' +
      'scaled score, the fraction of rows whose maximum is tied (within <code>attention.tie_tol</code>) or tied ' +
      'inside one key tile, the counts of normalised P = 1 (one definition for every backend) and of unnormalised ' +
      'exponentials P~ = 1 (per key tile for flash), and the mean row entropy. One panel per layer, a line per ' +
      'head in its run\'s colour, one scale shared by all panels and runs.');
    const TEXT = { max_logit: 'max logit', tied_row_frac: 'tied rows (fraction)', tied_in_tile_frac: 'tied in a tile (fraction)',
      p_one: 'P = 1 entries', p_tilde_one: 'P~ = 1 entries', entropy: 'entropy (nats)' };
    bySelection(s, 'attn', 's', 'statistic', TEXT, headRow, { points: true });
  }

  // ------------------------------------------------------------------ 5. delta drift
  {
    const s = section('drift', 'δ drift (Qiu & Yao)',
      'The attention backward\'s row term δ of the run\'s own attention against an FP64 recompute of the same ' +
      'inputs (<code>delta_drift.csv</code>). <code>delta_drift_cum</code>: the running sum over hook steps of ' +
      'Σ<sub>rows</sub>(δ<sub>run</sub> − δ<sub>fp64</sub>); a biased rounding error, the Qiu &amp; Yao signature, ' +
      'is one-signed and grows steadily, unbiased noise wanders around zero. <code>dwq_rel_err</code>: the ' +
      'relative error of the head\'s W<sub>Q</sub> gradient; <code>dwq_cos_prev</code>: cosine between consecutive ' +
      'hook steps\' error directions (near 1: the error keeps pushing the same way).');
    const TEXT = { delta_drift_cum: 'running sum of the δ error', delta_drift: 'δ error per hook step',
      dwq_rel_err: 'relative W_Q gradient error', dwq_cos_prev: 'cosine with the previous error direction' };
    bySelection(s, 'drift', 'f', 'quantity', TEXT, headRow,
      (f) => ({ points: true, zero: f !== 'dwq_rel_err', ylog: f === 'dwq_rel_err' }));
  }

  // ------------------------------------------------------------------ 6. weight distance
  {
    const s = section('distance', 'Weight distance to the reference',
      'How far each run\'s weights have moved from the reference run <b>' + ref.name.replace(/</g, '&lt;') +
      '</b> (Golden et al.), from the two runs\' checkpoints: the 1-D Wasserstein distance W1 between the weight ' +
      'values divided by the mean |w| of the reference, or the largest element-wise difference max |ΔW|. One panel ' +
      'per layer, runs as colours (per-head slices: a line per head), one log scale; a zero distance is not drawn. ' +
      'Each run\'s pairing of checkpoint steps is stated below; runs trained with <code>hooks.reference_run</code> ' +
      'and no comparable checkpoints are drawn from their <code>wasserstein.csv</code>.');
    D.distance_notes.forEach((n) => note(s, n));
    const tensors = new Set();
    for (const d of D.distance) {
      const r = R[d.run];
      s.append(el('p', { class: 'caption' }, el('span', { class: 'swatch', style: 'background:' + color(d.run) }),
        r.name + ' vs ' + (d.against == null ? 'its own reference run' : R[d.against].name) + ' (' + d.source + '): ' + (d.pairing || '')));
      d.notes.forEach((n) => note(s, r.name + ': ' + n));
      const zero = d.series.length && d.series.every((x) => x.w1n.every((v) => v === 0) && x.max.every((v) => v === 0));
      if (zero) note(s, r.name + ': the weights are identical to the reference at every compared step (W1 = max |ΔW| = 0)');
      d.series.forEach((x) => tensors.add(x.t));
    }
    const order = ['qkvw', 'attprojw', 'fcw', 'fcprojw', 'wq', 'wk', 'wv', 'wo', 'wte', 'wpe', 'ln1w', 'ln1b', 'ln2w', 'ln2b',
      'qkvb', 'attprojb', 'fcb', 'fcprojb', 'lnfw', 'lnfb'];
    const options = order.filter((t) => tensors.has(t)).map((t) => [t, t]);
    for (const t of tensors) if (!order.includes(t)) options.push([t, t]);
    if (options.length) {
      const ctl = el('div', { class: 'controls' });
      const body = el('div');
      s.append(ctl, body);
      const draw = () => {
        destroyIn(body);
        const t = state.sel.dist_tensor, m = state.sel.dist_metric;
        const rows = [];
        for (const d of D.distance)
          for (const x of d.series)
            if (x.t === t) rows.push({ run: d.run, l: x.l, h: x.h, x: x.x, y: m === 'max' ? x.max : x.w1n, tag: x.l < 0 ? x.t : '' });
        if (!rows.length) { note(body, 'no distances for ' + t); return; }
        smallMultiples(body, 'distance:' + m + ':' + t, rows, { ylog: true, points: true,
          sub: m === 'max' ? 'max |ΔW|' : 'W1 / mean |w|' });
      };
      select(ctl, 'dist_metric', 'distance', [['w1n', 'W1 / mean |w|'], ['max', 'max |ΔW|']], draw);
      select(ctl, 'dist_tensor', 'tensor', options, draw);
      draw();
    }
  }

  if (view.has('only')) {
    const keep = new Set(view.get('only').split(','));
    for (const sec of app.querySelectorAll('section')) if (!keep.has(sec.id)) sec.style.display = 'none';
  }
  app.append(el('footer', {}, 'Written by stabletrain report; charts: uPlot (MIT). File formats: docs/run_files.md.'));
  if (D.refresh_s > 0) {
    if (saved.scroll) window.scrollTo(0, saved.scroll);
    setTimeout(() => { saveState(); location.reload(); }, D.refresh_s * 1000);
  }
  document.body.dataset.panels = String(document.querySelectorAll('[data-panel]').length);
  document.body.dataset.renderMs = String(Math.round(performance.now() - t0));  // this script
  document.body.dataset.readyMs = String(Math.round(performance.now()));  // since the navigation began
  document.body.dataset.errors = String(errors.length);
  document.body.dataset.rendered = '1';
})();
