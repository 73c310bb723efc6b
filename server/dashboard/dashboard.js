// kvstore's dashboard: polls /v1/stats and /healthz of the server that served this page and
// draws the history it has seen since it opened, as plain SVG. No library, no external asset.
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
  const fmtNum = (x) => (Math.abs(x) >= 100 ? x.toFixed(0) : Number(x.toPrecision(3)).toString());
  const FORMATS = { ratio: fmtPct, bytes: fmtBytes, rate: fmtNum, count: fmtNum };

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

  // the smallest of 1, 2, 2.5, 5 times a power of ten (of 1024 for bytes) at or above x,
  // so that the four grid steps read as round numbers
  function niceCeil(x, unit) {
    if (!(x > 0)) return 1;
    const base = unit === "bytes" ? 1024 ** Math.floor(Math.log(x) / Math.log(1024)) : 1;
    const scaled = x / base;
    const p = 10 ** Math.floor(Math.log10(scaled));
    const step = [1, 2, 2.5, 5, 10].find((m) => m * p >= scaled);
    return step * p * base;
  }

  function draw(svg, series, emptyText) {
    const unit = svg.dataset.unit;
    const fmt = FORMATS[unit];
    const w = svg.clientWidth || 400;
    const h = svg.clientHeight || 190;
    const m = { left: 58, right: 10, top: 18, bottom: 20 };
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    const values = series.flatMap((s) => s.points.map((p) => p[1]).filter((v) => v !== null));
    if (values.length === 0) {
      svg.append(el("text", { x: w / 2, y: h / 2, "text-anchor": "middle", class: "empty" },
                    emptyText || "waiting for data"));
      return;
    }
    const t0 = samples[0].t;
    const t1 = Math.max(latest().t, t0 + 1);
    const top = unit === "ratio" ? 1 : niceCeil(Math.max(...values), unit);
    const x = (t) => m.left + ((t - t0) / (t1 - t0)) * (w - m.left - m.right);
    const y = (v) => h - m.bottom - (v / top) * (h - m.top - m.bottom);
    for (let i = 0; i <= 4; i += 1) {
      const v = (top * i) / 4;
      svg.append(el("line", { x1: m.left, x2: w - m.right, y1: y(v), y2: y(v), class: "axis" }));
      svg.append(el("text", { x: m.left - 4, y: y(v) + 3, "text-anchor": "end", class: "tick" },
                    fmt(v)));
    }
    const span = Math.round(t1 - t0);
    svg.append(el("text", { x: m.left, y: h - 4, class: "tick" }, `${span} s ago`));
    svg.append(el("text", { x: w - m.right, y: h - 4, "text-anchor": "end", class: "tick" }, "now"));
    let legendX = m.left;
    series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      let d = "";
      let pen = "M";
      let count = 0;
      let last = null;
      for (const [t, v] of s.points) {
        if (v === null) { pen = "M"; continue; }
        d += `${pen}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
        pen = "L";
        count += 1;
        last = v;
      }
      svg.append(el("path", { d: d || "M0,0", class: "series", stroke: color,
                              "data-name": s.name, "data-points": count,
                              "data-last": last === null ? "" : last }));
      const label = el("text", { x: legendX, y: 11, fill: color, class: "legend" },
                       `${s.name} ${last === null ? "" : fmt(last)}`);
      svg.append(label);
      legendX += 14 + (label.getComputedTextLength ? label.getComputedTextLength() : 80);
    });
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

    $("hit-rate").textContent = fmtPct(totals.hit_rate);
    $("hit-rate").dataset.value = totals.hit_rate;
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
    draw($("chart-s3-queue"), stats.tiers.s3 ? [
      { name: "pending", points: level((s) => s.stats.tiers.s3?.backend?.pending) }] : [],
         "no S3 tier");

    const tierBody = document.querySelector("#tiers tbody");
    tierBody.replaceChildren(...tiers.map((n) => {
      const t = stats.tiers[n];
      const up = (health.tiers || {})[n];
      return row([n, up === undefined ? "–" : up.ok ? "up" : "down", t.blocks, fmtBytes(t.bytes),
                  fmtBytes(t.capacity_bytes), fmtPct(t.occupancy), fmtPct(t.hit_rate),
                  t.evictions]);
    }));
    const nsBody = document.querySelector("#namespaces tbody");
    nsBody.replaceChildren(...namespaces.map((n) => {
      const s = stats.namespaces[n];
      return row([n, s.blocks, fmtBytes(s.bytes), fmtPct(s.hit_rate), fmtBytes(s.bytes_in),
                  fmtBytes(s.bytes_out)]);
    }));
    document.body.dataset.polls = samples.length;
  }

  function setStatus(text, cls) {
    $("status").textContent = text;
    $("status").className = `badge ${cls}`;
  }

  async function poll() {
    try {
      const [stats, health] = await Promise.all([getJSON("v1/stats"), getJSON("healthz")]);
      samples.push({ t: Date.now() / 1000, stats, health });
      if (samples.length > KEEP) samples.shift();
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
    poll();
  });
  takeTokenFromFragment();
  poll();
})();
