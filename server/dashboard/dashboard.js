// kvstore's dashboard: polls /v1/stats and /healthz of the server that served this page and
// draws the history it has seen since it opened, as plain SVG; reads /v1/info once for the
// version, ports and data dir, and each tier's what-if curve (/v1/whatif) every few polls.
// No library, no external asset.
// A token (when the server wants one) comes from the form or from #token=... in the address
// (a fragment never reaches the server or its logs); it is kept for this tab only. URLs are
// relative to the page, so that it also works behind a proxy that adds a path prefix.
"use strict";

(() => {
  const params = new URLSearchParams(location.search);
  const INTERVAL_MS = Math.max(200, Number(params.get("interval")) || 1000);
  const KEEP = 300; // samples of history (5 minutes at the default interval)
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d",
                  "#4d7c0f"];
  const SVG = "http://www.w3.org/2000/svg";
  const TOKEN_KEY = "kvstore-dashboard-token";
  const samples = []; // {t: seconds, stats, health}
  let info = null; // the server's /v1/info, read with the first poll that a token allows
  const WHATIF_EVERY = 5; // polls between two reads of the what-if curves
  let curves = []; // [{tier, doc}] from /v1/whatif, or [] with curves off (curvesOff says why)
  let curvesOff = "";
  let pollCount = 0;
  const $ = (id) => document.getElementById(id);

  class AuthNeeded extends Error {}

  // -- token --------------------------------------------------------------------------------
  function takeTokenFromFragment() {
    const frag = new URLSearchParams(location.hash.slice(1));
    if (frag.has("token")) {
      sessionStorage.setItem(TOKEN_KEY, frag.get("token"));
      window.history.replaceState(null, "", location.pathname + location.search);
    }
  }

  function authHeaders() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    return token ? { Authorization: `Bearer ${token}` } : {};
  }

  async function getJSON(path) {
    const r = await fetch(path, { headers: authHeaders(), cache: "no-store" });
    if (r.status === 401) throw new AuthNeeded((await r.json()).message || "token needed");
    if (!r.ok && r.status !== 503) throw new Error(`${path}: HTTP ${r.status}`);
    return r.json(); // /healthz answers 503 with its document when a tier is down
  }

  // -- formatting ---------------------------------------------------------------------------
  function fmtBytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
  }
  const fmtPct = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`);
  // a row's hit rate: "–" where nothing was asked for (the server says 0 then)
  const fmtHitRate = (row) => (row && row.queries > 0 ? fmtPct(row.hit_rate) : "–");
  const fmtNum = (x) => (Math.abs(x) >= 100 ? x.toFixed(0) : Number(x.toPrecision(3)).toString());
  const FORMATS = { ratio: fmtPct, bytes: fmtBytes, rate: fmtNum, count: fmtNum };
  // axis labels: whole percents, and "2 KiB" rather than "2.0 KiB" (a tick is a round number)
  const TICK_FORMATS = { ...FORMATS, ratio: (x) => `${Math.round(100 * x)}%`,
                         bytes: (x) => fmtBytes(x).replace(/\.0 /, " ") };

  // -- series from the history --------------------------------------------------------------
  // A rate is the change between two polls; a counter that went down (restart) is a gap.
  function deltas(pick) {
    const out = [];
    for (let i = 1; i < samples.length; i += 1) {
      const a = pick(samples[i - 1]);
      const b = pick(samples[i]);
      out.push([samples[i].t, a === undefined || b === undefined ? null : [a, b,
                samples[i].t - samples[i - 1].t]]);
    }
    return out;
  }

  function hitRate(rowOf) {
    return deltas((s) => rowOf(s)).map(([t, d]) => {
      if (d === null) return [t, null];
      const [a, b] = d;
      const queries = b.queries - a.queries;
      const hits = b.hits - a.hits;
      return [t, queries > 0 && hits >= 0 ? hits / queries : null];
    });
  }

  function perSecond(valueOf) {
    return deltas(valueOf).map(([t, d]) => {
      if (d === null) return [t, null];
      const [a, b, dt] = d;
      return [t, b >= a && dt > 0 ? (b - a) / dt : null];
    });
  }

  const level = (valueOf) => samples.map((s) => [s.t, valueOf(s) ?? null]);
  const latest = () => samples[samples.length - 1];
  // tiers in the server's order (top first), namespaces by name
  const tierNames = () => Object.keys(latest().stats.tiers || {});
  const nsNames = () => Object.keys(latest().stats.namespaces || {}).sort();

  // -- charts -------------------------------------------------------------------------------
  function el(name, attrs, text) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // The y-axis's labelled values, 0 first: four equal steps up to at least ``max``, each step a
  // round number of the unit (a power of two of bytes, a whole count, 1, 2 or 5 times a power of
  // ten otherwise), so that no two labels read the same at any size. Only data that is all zero
  // (or none) gets a single label, 0, on the baseline.
  function yTicks(max, unit) {
    if (unit === "ratio") return [0, 0.25, 0.5, 0.75, 1];
    if (!(max > 0)) return [0];
    const quarter = max / 4;
    let step;
    if (unit === "bytes") {
      step = Math.max(1, 2 ** Math.ceil(Math.log2(quarter)));
    } else {
      const p = 10 ** Math.floor(Math.log10(quarter));
      step = [1, 2, 5, 10].find((m) => m * p >= quarter) * p;
      if (unit === "count") step = Math.max(1, Math.ceil(step));
    }
    return [0, 1, 2, 3, 4].map((i) => i * step);
  }

  // the HTML legend under a chart: one key per series, its colour and its latest value
  function drawLegend(svg, keys) {
    const legend = document.querySelector(`.legend[data-for="${svg.id}"]`);
    legend.replaceChildren(...keys.map(({ name, color, value }) => {
      const key = document.createElement("span");
      key.className = "key";
      key.dataset.name = name;
      key.style.setProperty("--key", color); // CSSOM: allowed by the page's CSP
      const shown = document.createElement("b");
      shown.textContent = value;
      key.append(`${name} `, shown);
      return key;
    }));
  }

  function draw(svg, series, emptyText) {
    const unit = svg.dataset.unit;
    const fmt = FORMATS[unit];
    const w = svg.clientWidth || 400;
    const h = svg.clientHeight || 190;
    const m = { left: 52, right: 10, top: 8, bottom: 20 };
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    const lastOf = (s) => s.points.reduce((v, p) => (p[1] === null ? v : p[1]), null);
    drawLegend(svg, series.map((s, i) => {
      const last = lastOf(s);
      return { name: s.name, color: COLORS[i % COLORS.length],
               value: last === null ? "–" : fmt(last) };
    }));
    const values = series.flatMap((s) => s.points.map((p) => p[1]).filter((v) => v !== null));
    if (values.length === 0) {
      svg.append(el("text", { x: w / 2, y: h / 2, "text-anchor": "middle", class: "empty" },
                    emptyText || "waiting for data"));
      return;
    }
    const t0 = samples[0].t;
    const t1 = Math.max(latest().t, t0 + 1);
    const ticks = yTicks(Math.max(...values), unit);
    const top = ticks.length > 1 ? ticks[ticks.length - 1] : 1; // all zero: 0 on the baseline
    const x = (t) => m.left + ((t - t0) / (t1 - t0)) * (w - m.left - m.right);
    const y = (v) => h - m.bottom - (v / top) * (h - m.top - m.bottom);
    for (const v of ticks) {
      svg.append(el("line", { x1: m.left, x2: w - m.right, y1: y(v), y2: y(v), class: "axis" }));
      svg.append(el("text", { x: m.left - 4, y: y(v) + 3, "text-anchor": "end",
                              class: "tick y", "data-value": v }, TICK_FORMATS[unit](v)));
    }
    const span = Math.round(t1 - t0);
    svg.append(el("text", { x: m.left, y: h - 4, class: "tick" }, `${span} s ago`));
    svg.append(el("text", { x: w - m.right, y: h - 4, "text-anchor": "end", class: "tick" }, "now"));
    series.forEach((s, i) => {
      let d = "";
      let pen = "M";
      let count = 0;
      for (const [t, v] of s.points) {
        if (v === null) { pen = "M"; continue; }
        d += `${pen}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
        pen = "L";
        count += 1;
      }
      const last = lastOf(s);
      svg.append(el("path", { d: d || "M0,0", class: "series", stroke: COLORS[i % COLORS.length],
                              "data-name": s.name, "data-points": count,
                              "data-last": last === null ? "" : last }));
    });
  }

  // The what-if curves: hit rate against capacity as a multiple of today's (log scale, so that
  // tiers of any size share the axis), one line per tier, today's capacity a dashed line.
  function drawCurves(svg) {
    const w = svg.clientWidth || 400;
    const h = svg.clientHeight || 190;
    const m = { left: 52, right: 10, top: 8, bottom: 20 };
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    const scaled = curves.map(({ tier, doc }) => ({
      name: tier, today: doc.current.capacity_bytes,
      points: doc.points.map((p) => [p.capacity_bytes / doc.current.capacity_bytes,
                                     p.hit_rate]) }));
    const at = (c, x) => { // the curve at x times today's capacity (the nearest point)
      const off = (p) => Math.abs(Math.log(p[0] / x));
      return c.points.reduce((best, p) => (off(p) < off(best) ? p : best))[1];
    };
    drawLegend(svg, scaled.map((c, i) => ({
      name: c.name, color: COLORS[i % COLORS.length],
      value: `${fmtPct(at(c, 1))} → ${fmtPct(at(c, 2))} at 2×` })));
    if (scaled.length === 0) {
      svg.append(el("text", { x: w / 2, y: h / 2, "text-anchor": "middle", class: "empty" },
                    curvesOff || "waiting for data"));
      return;
    }
    const xs = scaled.flatMap((c) => c.points.map((p) => p[0]));
    const lo = Math.log(Math.min(...xs));
    const hi = Math.max(Math.log(Math.max(...xs)), lo + 1e-9);
    const x = (v) => m.left + ((Math.log(v) - lo) / (hi - lo)) * (w - m.left - m.right);
    const y = (v) => h - m.bottom - v * (h - m.top - m.bottom);
    for (const v of yTicks(1, "ratio")) {
      svg.append(el("line", { x1: m.left, x2: w - m.right, y1: y(v), y2: y(v), class: "axis" }));
      svg.append(el("text", { x: m.left - 4, y: y(v) + 3, "text-anchor": "end",
                              class: "tick y", "data-value": v }, TICK_FORMATS.ratio(v)));
    }
    for (const v of [0.25, 0.5, 1, 2, 4].filter((v) => Math.log(v) >= lo - 1e-9
                                                        && Math.log(v) <= hi + 1e-9)) {
      svg.append(el("text", { x: x(v), y: h - 4, "text-anchor": "middle", class: "tick x" },
                    `${v}×`));
    }
    svg.append(el("line", { x1: x(1), x2: x(1), y1: m.top, y2: h - m.bottom, class: "today",
                            "data-x": 1 }));
    scaled.forEach((c, i) => {
      const d = c.points.map((p, j) => `${j ? "L" : "M"}${x(p[0]).toFixed(1)},`
                             + `${y(p[1]).toFixed(1)}`).join("");
      svg.append(el("path", { d, class: "series", stroke: COLORS[i % COLORS.length],
                              "data-name": c.name, "data-points": c.points.length,
                              "data-last": at(c, 1), "data-double": at(c, 2),
                              "data-today": c.today }));
    });
  }

  async function readCurves() {
    const tiers = tierNames(); // none for a tenant: its curve in the top tier
    const docs = [];
    for (const tier of tiers.length ? tiers : [null]) {
      const r = await fetch(tier ? `v1/whatif?tier=${encodeURIComponent(tier)}` : "v1/whatif",
                            { headers: authHeaders(), cache: "no-store" });
      const doc = await r.json();
      if (r.status === 404) { curvesOff = doc.message || "what-if curves are off"; return []; }
      if (!r.ok) throw new Error(`v1/whatif: HTTP ${r.status}`);
      docs.push({ tier: doc.tier, doc });
    }
    curvesOff = "";
    return docs;
  }

  // -- the page -----------------------------------------------------------------------------
  function row(cells) {
    const tr = document.createElement("tr");
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = c;
      tr.append(td);
    }
    return tr;
  }

  function render() {
    const { stats, health } = latest();
    const totals = stats.totals;
    const tiers = tierNames();
    const namespaces = nsNames();
    const noTiers = "no tier rows for this token (tiers are shared; a tenant sees none)";

    $("hit-rate").textContent = fmtHitRate(totals);
    $("hit-rate").dataset.value = totals.queries > 0 ? totals.hit_rate : "";
    $("blocks").textContent = totals.blocks;
    $("bytes").textContent = fmtBytes(totals.bytes);
    $("pinned").textContent = totals.pinned_bytes === undefined ? "–"
      : `${fmtBytes(totals.pinned_bytes)} (${totals.pinned} blocks)`;
    const s3 = (health.tiers || {}).s3;
    $("s3").textContent = s3 === undefined ? "no S3 tier"
      : s3.ok ? "up" : `degraded: ${s3.reason || s3.error || "down"}`;
    $("s3").className = `value ${s3 === undefined ? "muted" : s3.ok ? "good" : "bad"}`;

    draw($("chart-tier-hits"), tiers.map((n) => ({
      name: n, points: hitRate((s) => s.stats.tiers[n]) })), tiers.length ? "" : noTiers);
    draw($("chart-ns-hits"), namespaces.map((n) => ({
      name: n, points: hitRate((s) => s.stats.namespaces[n]) })), "no namespace has traffic yet");
    draw($("chart-occupancy"), tiers.map((n) => ({
      name: n, points: level((s) => s.stats.tiers[n]?.occupancy) })), noTiers);
    draw($("chart-evictions"), tiers.map((n) => ({
      name: n, points: perSecond((s) => s.stats.tiers[n]?.evictions) })), noTiers);
    draw($("chart-bytes"), [
      { name: "in", points: perSecond((s) => s.stats.totals.bytes_in) },
      { name: "out", points: perSecond((s) => s.stats.totals.bytes_out) }]);
    draw($("chart-pinned"), [
      { name: "pinned", points: level((s) => s.stats.totals.pinned_bytes) }],
         "pinned bytes are the admin's to see");
    drawCurves($("chart-whatif"));
    draw($("chart-s3-queue"), stats.tiers.s3 ? [
      { name: "pending", points: level((s) => s.stats.tiers.s3?.backend?.pending) }] : [],
         "no S3 tier");

    const tierBody = document.querySelector("#tiers tbody");
    tierBody.replaceChildren(...tiers.map((n) => {
      const t = stats.tiers[n];
      const up = (health.tiers || {})[n];
      return row([n, up === undefined ? "–" : up.ok ? "up" : "down", t.blocks, fmtBytes(t.bytes),
                  fmtBytes(t.capacity_bytes), fmtPct(t.occupancy), fmtHitRate(t),
                  t.evictions]);
    }));
    const nsBody = document.querySelector("#namespaces tbody");
    nsBody.replaceChildren(...namespaces.map((n) => {
      const s = stats.namespaces[n];
      return row([n, s.blocks, fmtBytes(s.bytes), fmtHitRate(s), fmtBytes(s.bytes_in),
                  fmtBytes(s.bytes_out)]);
    }));
    document.body.dataset.polls = samples.length;
  }

  function showInfo() {
    const off = (v) => (v === null || v === undefined ? "off" : String(v));
    $("version").textContent = info.version;
    $("rest-port").textContent = info.rest_port ?? (location.port || "–");
    $("data-port").textContent = off(info.data_port);
    $("unix-socket").textContent = off(info.unix_socket);
    // the admin's answer names the data dir; a tenant's does not
    $("data-dir").textContent = info.data_dir ?? "–";
    $("data-dir").title = info.data_dir ? "" : "shown to the admin only";
  }

  function setStatus(text, cls) {
    $("status").textContent = text;
    $("status").className = `badge ${cls}`;
  }

  async function poll() {
    try {
      const [stats, health, about] = await Promise.all([
        getJSON("v1/stats"), getJSON("healthz"), info ?? getJSON("v1/info")]);
      if (info === null) { info = about; showInfo(); }
      samples.push({ t: Date.now() / 1000, stats, health });
      if (samples.length > KEEP) samples.shift();
      pollCount += 1;
      if (pollCount % WHATIF_EVERY === 1) {
        try {
          curves = await readCurves();
        } catch (err) { // the stats still draw; the curves wait for the next read
          if (err instanceof AuthNeeded) throw err;
          curvesOff = `what-if curves: ${err.message}`;
        }
      }
      $("auth").hidden = true;
      $("board").hidden = false;
      render();
      setStatus(health.ok ? "live" : "degraded", health.ok ? "good" : "bad");
      $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      if (err instanceof AuthNeeded) {
        $("auth").hidden = false;
        $("board").hidden = true;
        $("auth-error").textContent = sessionStorage.getItem(TOKEN_KEY) ? err.message : "";
        setStatus("token needed", "bad");
        return; // the form restarts polling
      }
      setStatus(`error: ${err.message}`, "bad");
    }
    setTimeout(poll, INTERVAL_MS);
  }

  $("auth").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    info = null; // another token may see more (or less) of it
    poll();
  });
  // charts are drawn to their size: draw them again when it changes
  window.addEventListener("resize", () => { if (samples.length) render(); });
  takeTokenFromFragment();
  poll();
})();
